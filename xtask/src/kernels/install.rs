//! What the kernel matrix needs on the host, installed only when missing: Debian's kernel
//! packages (from the bullseye, bookworm and bookworm-backports suites, added beside the
//! existing Debian source with its URIs and Signed-By), qemu and busybox through apt-get, and
//! virtme-ng in a project-local virtualenv (target/kernel-tools/venv).
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};

use crate::{on_path, workspace_root};

pub const VIRTME_NG: &str = "virtme-ng==1.42";
/// Our suites go here, so that the system's own source files stay as they are.
const SOURCES_FILE: &str = "/etc/apt/sources.list.d/gpu-agent-kernels.sources";

/// One kernel series of the matrix and the Debian suite that ships it.
pub struct Series {
    pub series: &'static str,
    pub suite: &'static str,
    pub distro: &'static str,
}

pub const SERIES: &[Series] = &[
    Series {
        series: "5.10",
        suite: "bullseye",
        distro: "Debian 11",
    },
    Series {
        series: "6.1",
        suite: "bookworm",
        distro: "Debian 12",
    },
    Series {
        series: "6.12",
        suite: "bookworm-backports",
        distro: "Debian 12 backports",
    },
];

/// "6.12.117+deb12-amd64" -> Some("6.12"); None for other flavours (cloud, rt) and arches.
pub fn series_of(release: &str) -> Option<String> {
    let flavour = release.rsplit_once('-')?.1;
    if flavour != "amd64" || release.contains("-cloud-") || release.contains("-rt-") {
        return None;
    }
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some(format!("{}.{}", it.next()?, it.next()?))
}

/// The numbers of a release, for ordering: "5.10.0-32-amd64" -> [5, 10, 0, 32].
pub fn version_key(release: &str) -> Vec<u64> {
    // Without the flavour: "amd64" would count as a number.
    let release = match release.rsplit_once('-') {
        Some((v, flavour)) if flavour.starts_with(|c: char| c.is_ascii_alphabetic()) => v,
        _ => release,
    };
    release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The newest kernel of `series` installed with its modules (virtme-ng loads virtio and 9p
/// from them).
fn installed(series: &str) -> Option<String> {
    let mut found: Vec<String> = std::fs::read_dir("/boot")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let rel = e
                .file_name()
                .to_str()?
                .strip_prefix("vmlinuz-")?
                .to_string();
            let mods = Path::new("/lib/modules").join(&rel).join("modules.dep");
            (series_of(&rel).as_deref() == Some(series) && mods.is_file()).then_some(rel)
        })
        .collect();
    found.sort_by_key(|r| version_key(r));
    found.pop()
}

/// The newest `linux-image-<release>-unsigned` of `series` that apt knows.
fn candidate(series: &str) -> Option<String> {
    let pattern = format!(
        "^linux-image-{}\\.[^ ]*-amd64-unsigned$",
        series.replace('.', "\\.")
    );
    let out = Command::new("apt-cache")
        .args(["search", "--names-only", &pattern])
        .output()
        .ok()?;
    let mut found: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let name = l.split_whitespace().next()?;
            let rel = name
                .strip_prefix("linux-image-")?
                .strip_suffix("-unsigned")?;
            (series_of(rel).as_deref() == Some(series)).then(|| rel.to_string())
        })
        .collect();
    found.sort_by_key(|r| version_key(r));
    found.pop()
}

/// Makes sure qemu, busybox and a kernel of every series in `wanted` are installed;
/// returns (series, release) for each. Nothing is asked of apt when nothing is missing.
pub fn ensure(wanted: &[&Series]) -> Result<Vec<(String, String)>> {
    let need_qemu = on_path("qemu-system-x86_64").is_none();
    // virtme-ng builds its initramfs around busybox.
    let need_busybox = on_path("busybox").is_none();
    let mut found = vec![];
    let mut missing = vec![];
    for s in wanted {
        match installed(s.series) {
            Some(rel) => found.push((s.series.to_string(), rel)),
            None => missing.push(*s),
        }
    }
    if !need_qemu && !need_busybox && missing.is_empty() {
        return Ok(found);
    }
    if !crate::is_root() {
        bail!("installing qemu, busybox or kernel packages needs root: run as root");
    }
    add_suites(&SERIES.iter().map(|s| s.suite).collect::<Vec<_>>())?;
    apt(&["update", "-qq"])?;
    if need_qemu {
        eprintln!("xtask: installing qemu-system-x86 (apt-get)");
        // A host with qemu-utils from backports (Breaks: older qemu-system-common) needs
        // qemu from there too.
        apt_install(&["qemu-system-x86"], Some("bookworm-backports"))?;
    }
    if need_busybox {
        eprintln!("xtask: installing busybox-static (apt-get)");
        apt_install(&["busybox-static"], None)?;
    }
    for s in missing {
        let Some(rel) = candidate(s.series) else {
            bail!(
                "no linux-image-{}.*-amd64-unsigned package in apt's lists (suite {}); see \
                 `apt-cache search --names-only '^linux-image-{}'`",
                s.series,
                s.suite,
                s.series
            );
        };
        let pkg = format!("linux-image-{rel}-unsigned");
        eprintln!("xtask: installing {pkg} ({}, {})", s.distro, s.suite);
        apt_install(&[&pkg], Some(s.suite))?;
        match installed(s.series) {
            Some(rel) => found.push((s.series.to_string(), rel)),
            None => bail!("{pkg} installed, but /boot/vmlinuz-{rel} or its modules are missing"),
        }
    }
    Ok(found)
}

/// target/kernel-tools/venv with virtme-ng at its pinned version; returns its bin/.
pub fn virtme_ng() -> Result<PathBuf> {
    let venv = workspace_root().join("target/kernel-tools/venv");
    let python = venv.join("bin/python3");
    if !python.is_file() {
        eprintln!("xtask: creating {}", venv.display());
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            bail!(
                "`python3 -m venv {}` failed: apt-get install -y python3-venv",
                venv.display()
            );
        }
    }
    let (name, version) = VIRTME_NG.split_once("==").unwrap();
    let has = Command::new(&python)
        .args([
            "-c",
            &format!("import importlib.metadata as m; print(m.version('{name}'))"),
        ])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == version);
    if !has {
        eprintln!("xtask: installing {VIRTME_NG} into {}", venv.display());
        let ok = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                VIRTME_NG,
            ])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            bail!("{} -m pip install {VIRTME_NG} failed", python.display());
        }
    }
    Ok(venv.join("bin"))
}

/// One apt source stanza: its URIs, suites and key.
#[derive(Debug, PartialEq)]
struct Source {
    uris: Vec<String>,
    suites: Vec<String>,
    signed_by: Option<String>,
}

/// The deb822 stanzas of `text` that hold `deb` lines.
fn parse_deb822(text: &str) -> Vec<Source> {
    let mut out = vec![];
    for stanza in text.split("\n\n") {
        let (mut deb, mut uris, mut suites, mut signed_by) = (false, vec![], vec![], None);
        for line in stanza.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let words = || v.split_whitespace().map(String::from).collect::<Vec<_>>();
            match k.trim() {
                "Types" => deb = v.split_whitespace().any(|t| t == "deb"),
                "URIs" => uris = words(),
                "Suites" => suites = words(),
                "Signed-By" => signed_by = Some(v.trim().to_string()),
                _ => {}
            }
        }
        if deb && !uris.is_empty() {
            out.push(Source {
                uris,
                suites,
                signed_by,
            });
        }
    }
    out
}

/// Every `deb` source configured (deb822 files and one-line lists).
fn sources() -> Vec<Source> {
    let mut out = vec![];
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(dir.flatten().map(|e| e.path()));
    }
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        match f.extension().and_then(|e| e.to_str()) {
            Some("sources") => out.extend(parse_deb822(&text)),
            Some("list") => out.extend(text.lines().filter_map(parse_one_line)),
            _ => {}
        }
    }
    out
}

/// `deb [signed-by=K] URI SUITE COMPONENTS...`
fn parse_one_line(line: &str) -> Option<Source> {
    let rest = line.trim().strip_prefix("deb ")?.trim();
    let (opts, rest) = match rest.strip_prefix('[') {
        Some(r) => r.split_once(']')?,
        None => ("", rest),
    };
    let signed_by = opts
        .split_whitespace()
        .find_map(|o| o.strip_prefix("signed-by="))
        .map(String::from);
    let mut words = rest.split_whitespace();
    Some(Source {
        uris: vec![words.next()?.to_string()],
        suites: vec![words.next()?.to_string()],
        signed_by,
    })
}

/// The main Debian archive's source: a URI ending in /debian (not debian-security).
fn is_debian(uri: &str) -> bool {
    uri.trim_end_matches('/').ends_with("/debian")
}

/// Adds the suites the Debian source lacks, in a file of our own with its URIs and key.
fn add_suites(wanted: &[&str]) -> Result<()> {
    let all = sources();
    let debian = all
        .iter()
        .find(|s| s.uris.iter().any(|u| is_debian(u)))
        .context(
            "no Debian source (a `deb` entry with a URI ending in /debian) in /etc/apt: the \
             kernel packages come from Debian's bullseye, bookworm and bookworm-backports",
        )?;
    let have = |suite: &str| {
        all.iter()
            .any(|s| s.uris.iter().any(|u| is_debian(u)) && s.suites.iter().any(|x| x == suite))
    };
    let mut add: Vec<&str> = wanted.iter().copied().filter(|s| !have(s)).collect();
    if add.is_empty() {
        return Ok(());
    }
    add.sort();
    add.dedup();
    // Keep what an earlier run put in our file.
    let ours = std::fs::read_to_string(SOURCES_FILE).unwrap_or_default();
    let mut suites: Vec<String> = parse_deb822(&ours)
        .into_iter()
        .flat_map(|s| s.suites)
        .collect();
    suites.extend(add.iter().map(|s| s.to_string()));
    suites.sort();
    suites.dedup();
    let text = render_source(debian, &suites);
    eprintln!(
        "xtask: adding the suites {} to {SOURCES_FILE} (URIs and Signed-By of the Debian source)",
        add.join(" ")
    );
    std::fs::write(SOURCES_FILE, text).with_context(|| format!("writing {SOURCES_FILE}"))
}

fn render_source(debian: &Source, suites: &[String]) -> String {
    let mut text = format!(
        "# Added by `cargo xtask kernel-matrix` (gpu-agent): older and newer Debian kernels.\n\
         Types: deb\nURIs: {}\nSuites: {}\nComponents: main\n",
        debian.uris.join(" "),
        suites.join(" ")
    );
    if let Some(k) = &debian.signed_by {
        text.push_str(&format!("Signed-By: {k}\n"));
    }
    text
}

fn apt(args: &[&str]) -> Result<()> {
    let status = Command::new("apt-get")
        .args(args)
        .args(["-o", "DPkg::Lock::Timeout=300"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        // virtme-ng makes its own initramfs: skip initramfs-tools' (a minute per kernel).
        .env("INITRD", "No")
        .stdout(Stdio::null())
        .status()
        .context("running apt-get")?;
    if !status.success() {
        bail!("apt-get {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// `apt-get install`; if apt cannot resolve it and `suite` is given, again from that suite
/// (`-t`), for dependencies only that suite has at the needed version.
fn apt_install(packages: &[&str], suite: Option<&str>) -> Result<()> {
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(packages);
    match (apt(&args), suite) {
        (Ok(()), _) => Ok(()),
        (Err(e), None) => Err(e),
        (Err(_), Some(suite)) => {
            eprintln!("xtask: retrying from {suite}: apt-get -t {suite} install ...");
            let mut with_t = vec!["-t", suite];
            with_t.extend(&args);
            apt(&with_t)
        }
    }
}

#[cfg(test)]
mod t {
    use super::*;

    #[test]
    fn series_and_ordering_of_debian_releases() {
        assert_eq!(series_of("5.10.0-32-amd64").as_deref(), Some("5.10"));
        assert_eq!(series_of("6.12.117+deb12-amd64").as_deref(), Some("6.12"));
        assert_eq!(series_of("6.12.117+deb12-cloud-amd64"), None);
        assert_eq!(series_of("6.1.0-56-rt-amd64"), None);
        assert_eq!(series_of("6.1.0-56-arm64"), None);
        let mut v = [
            "6.12.90+deb12.1-amd64",
            "6.12.117+deb12-amd64",
            "6.12.90+deb12-amd64",
        ];
        v.sort_by_key(|r| version_key(r));
        assert_eq!(
            v,
            [
                "6.12.90+deb12-amd64",
                "6.12.90+deb12.1-amd64",
                "6.12.117+deb12-amd64"
            ]
        );
    }

    #[test]
    fn reads_both_source_formats() {
        let deb822 = "Types: deb\n# comment\nURIs: http://deb.debian.org/debian\n\
                      Suites: bookworm bookworm-updates\nComponents: main\n\
                      Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
                      Types: deb-src\nURIs: http://x/debian\nSuites: bookworm\n";
        let s = parse_deb822(deb822);
        assert_eq!(s.len(), 1, "deb-src is not a binary source");
        assert_eq!(s[0].suites, ["bookworm", "bookworm-updates"]);
        let text = render_source(&s[0], &["bullseye".into(), "bookworm-backports".into()]);
        assert_eq!(
            parse_deb822(&text),
            [Source {
                uris: vec!["http://deb.debian.org/debian".into()],
                suites: vec!["bullseye".into(), "bookworm-backports".into()],
                signed_by: Some("/usr/share/keyrings/debian-archive-keyring.gpg".into()),
            }]
        );
        let one =
            parse_one_line("deb [arch=amd64 signed-by=/k.gpg] http://m/debian/ bullseye main")
                .unwrap();
        assert_eq!(
            (
                one.uris[0].as_str(),
                one.suites[0].as_str(),
                one.signed_by.as_deref()
            ),
            ("http://m/debian/", "bullseye", Some("/k.gpg"))
        );
        assert!(is_debian(&one.uris[0]));
        assert!(!is_debian("http://deb.debian.org/debian-security"));
    }
}
