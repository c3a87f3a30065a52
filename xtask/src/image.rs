//! `cargo xtask image`: the agent's image, built by a real dockerd from deploy/Dockerfile.
//!
//! It builds the release agent on the host (`cargo xtask build`), makes the Debian bookworm
//! base from Debian's packages when no registry can be reached (debootstrap, cached under
//! target/image/), starts Debian's dockerd with state of its own, builds the Dockerfile's
//! `prebuilt` stage on that base, and saves the image to target/image/gpu-agent-<version>.tar
//! (`docker load`, `ctr -n k8s.io images import`, `kind load image-archive` take it).
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context, Result};

use crate::{
    benchkit::host::release_agent,
    e2e::{dockerd::Dockerd, host::WorkDir, proc},
    is_root, on_path, workspace_root,
};

/// The Debian release of the base: the agent is built on Debian 12 (glibc 2.36).
const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
const SECURITY_MIRROR: &str = "http://deb.debian.org/debian-security";
/// The tag the local base gets; passed to the Dockerfile as BASE.
pub const LOCAL_BASE: &str = "localhost/gpu-agent-base:bookworm";

/// The image's default name.
pub fn default_tag() -> String {
    format!("gpu-agent:{}", env!("CARGO_PKG_VERSION"))
}

pub fn archive_path(tag: &str) -> PathBuf {
    let file = tag.rsplit('/').next().unwrap_or(tag).replace(':', "-");
    workspace_root()
        .join("target/image")
        .join(format!("{file}.tar"))
}

pub struct Options {
    pub tag: String,
    /// Rebuild the cached debootstrap base.
    pub refresh_base: bool,
    /// BASE for the Dockerfile: a pulled image (pinned by digest) instead of the local one.
    pub base: Option<String>,
}

/// `cargo xtask image`.
pub fn run(opts: &Options) -> Result<()> {
    if !is_root() {
        bail!("cargo xtask image starts its own dockerd and runs debootstrap: run it as root");
    }
    ensure_packages(&[("dockerd", "docker.io"), ("debootstrap", "debootstrap")])?;
    let started = Instant::now();
    let bin = release_agent()?;
    let mut work = WorkDir::create()?;
    let result = (|| {
        let dockerd = Dockerd::start(&work.join("docker"), &[])?;
        build(&dockerd, &bin, opts)?;
        let archive = archive_path(&opts.tag);
        dockerd.run(&["save", "--output", &archive.to_string_lossy(), &opts.tag])?;
        std::fs::set_permissions(
            &archive,
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )?;
        let (tag, a) = (&opts.tag, archive.display());
        eprintln!(
            "xtask: image {tag} saved to {a} ({:.0} s). Load it with `docker load -i {a}`, \
             `ctr -n k8s.io images import {a}` or `kind load image-archive {a}`",
            started.elapsed().as_secs_f64()
        );
        anyhow::Ok(())
    })();
    work.remove();
    result
}

/// Builds the image in `dockerd` from deploy/Dockerfile's `prebuilt` stage with `bin` as
/// the agent.
pub fn build(dockerd: &Dockerd, bin: &Path, opts: &Options) -> Result<()> {
    let base = match &opts.base {
        Some(b) => b.clone(),
        None => {
            let tar = ensure_base_rootfs(opts.refresh_base)?;
            dockerd.run(&[
                "import",
                "--message",
                "Debian bookworm minbase (debootstrap), made by cargo xtask image",
                &tar.to_string_lossy(),
                LOCAL_BASE,
            ])?;
            LOCAL_BASE.to_string()
        }
    };
    let context = stage_context(bin)?;
    let dockerfile = workspace_root().join("deploy/Dockerfile");
    let log = workspace_root().join("target/image/build.log");
    let _ = std::fs::remove_file(&log);
    let mut cmd = dockerd.cmd(&[
        "build",
        // RUN steps (setcap) need a network namespace, and this dockerd has no bridge.
        "--network",
        "host",
        "--target",
        "prebuilt",
        "--build-arg",
        &format!("BASE={base}"),
        "--tag",
        &opts.tag,
        "--file",
        &dockerfile.to_string_lossy(),
        &context.to_string_lossy(),
    ]);
    // BuildKit: skips the stages `prebuilt` does not need (the from-source build).
    cmd.env("DOCKER_BUILDKIT", "1")
        .env("BUILDKIT_PROGRESS", "plain");
    eprintln!(
        "xtask: docker build --target prebuilt (BASE={base}) -> {}",
        opts.tag
    );
    let built = proc::logged(&mut cmd, &log);
    let _ = std::fs::remove_dir_all(&context);
    built
}

/// The build context of the `prebuilt` stage: the one binary, at the path the Dockerfile
/// copies from (and the binary `bin`, whichever build it is). Smaller and surer than the
/// repository root with its .dockerignore.
fn stage_context(bin: &Path) -> Result<PathBuf> {
    let ctx = workspace_root().join("target/image/context");
    let _ = std::fs::remove_dir_all(&ctx);
    let dst = ctx.join("target/release/gpu-agent");
    std::fs::create_dir_all(dst.parent().unwrap())?;
    std::fs::copy(bin, &dst).with_context(|| format!("copying {}", bin.display()))?;
    Ok(ctx)
}

/// The base's root filesystem as a tar, cached in target/image/: debootstrap's minbase of
/// bookworm with bookworm-updates and the security archive applied, apt's lists and caches,
/// documentation and locales removed (what debian:bookworm-slim leaves out).
pub fn ensure_base_rootfs(refresh: bool) -> Result<PathBuf> {
    let dir = workspace_root().join("target/image");
    std::fs::create_dir_all(&dir)?;
    // "-setcap": a base cached before libcap2-bin was included is not reused.
    let tar = dir.join(format!("debian-{SUITE}-minbase-setcap.tar"));
    if tar.is_file() && !refresh {
        eprintln!(
            "xtask: base root filesystem {} (cached; --refresh-base rebuilds it)",
            tar.display()
        );
        return Ok(tar);
    }
    let root = dir.join("rootfs");
    let log = dir.join("debootstrap.log");
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_file(&log);
    let started = Instant::now();
    eprintln!(
        "xtask: debootstrap --variant=minbase {SUITE} (about a minute; log: {})",
        log.display()
    );
    proc::logged(
        Command::new("debootstrap")
            // setcap, for the Dockerfile's file capabilities, without reaching Debian at build time.
            .args(["--variant=minbase", "--include=libcap2-bin", SUITE])
            .arg(&root)
            .arg(MIRROR),
        &log,
    )?;
    let result = (|| {
        std::fs::write(
            root.join("etc/apt/sources.list"),
            format!(
                "deb {MIRROR} {SUITE} main\ndeb {MIRROR} {SUITE}-updates main\n\
                 deb {SECURITY_MIRROR} {SUITE}-security main\n"
            ),
        )?;
        std::fs::copy("/etc/resolv.conf", root.join("etc/resolv.conf"))?;
        let chroot = |args: &[&str]| {
            let mut c = Command::new("chroot");
            c.arg(&root)
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive");
            proc::logged(&mut c, &log)
        };
        chroot(&["apt-get", "update", "-qq"])?;
        chroot(&["apt-get", "-y", "-qq", "upgrade"])?;
        chroot(&["apt-get", "clean"])?;
        slim(&root)?;
        proc::logged(
            Command::new("tar")
                .arg("--numeric-owner")
                .arg("-C")
                .arg(&root)
                .arg("-cf")
                .arg(&tar)
                .arg("."),
            &log,
        )
    })();
    let _ = std::fs::remove_dir_all(&root);
    result?;
    eprintln!(
        "xtask: base root filesystem {} made in {:.0} s",
        tar.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(tar)
}

/// What debian:bookworm-slim drops: docs, man pages, locales, apt lists; and the build
/// host's resolv.conf (the runtime writes its own).
fn slim(root: &Path) -> Result<()> {
    for d in [
        "var/lib/apt/lists",
        "var/cache/apt",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "var/log",
    ] {
        let p = root.join(d);
        if p.is_dir() {
            for e in std::fs::read_dir(&p)? {
                let e = e?.path();
                if e.is_dir() {
                    std::fs::remove_dir_all(&e)?;
                } else {
                    std::fs::remove_file(&e)?;
                }
            }
        }
    }
    std::fs::write(root.join("etc/resolv.conf"), "")?;
    Ok(())
}

/// Installs Debian packages whose binaries are missing (as root, through apt-get); an
/// error naming them otherwise.
pub fn ensure_packages(want: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = want
        .iter()
        .filter(|(bin, _)| on_path(bin).is_none() && !Path::new("/usr/sbin").join(bin).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() || on_path("apt-get").is_none() {
        bail!(
            "missing: apt-get install -y --no-install-recommends {}",
            missing.join(" ")
        );
    }
    eprintln!("xtask: installing {} (apt-get)", missing.join(" "));
    let log = workspace_root().join("target/image-apt.log");
    proc::logged(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        &log,
    )
    .or_else(|_| {
        proc::logged(
            Command::new("apt-get")
                .args(["update", "-qq"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            &log,
        )?;
        proc::logged(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
            &log,
        )
    })
}
