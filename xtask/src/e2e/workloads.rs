//! The harness's images and helpers around them: a busybox image made from Debian's
//! busybox-static (no registry here), the fake NVML scenario naming the workloads' host
//! PIDs, and the OCI runtime wrapper that gives the agent the capabilities dockerd 20.10
//! cannot name.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};
use serde_json::json;

use super::{dockerd::Dockerd, proc};
use crate::on_path;

/// The workloads' image (and containerd's sandbox image: its default command sleeps).
pub const BUSYBOX: &str = "localhost/e2e-busybox:1";
pub const PAUSE: &str = "localhost/e2e-pause:1";

/// Imports a busybox root filesystem into dockerd as BUSYBOX and PAUSE, and saves both to
/// an archive that containerd and podman import.
pub fn busybox_images(dockerd: &Dockerd, work: &Path) -> Result<PathBuf> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("busybox is not installed: apt-get install busybox-static")?;
    let root = work.join("busybox-rootfs");
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::copy(&busybox, bin.join("busybox"))?;
    for applet in ["sh", "sleep", "cat", "ls", "true"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet))?;
    }
    let tar = work.join("busybox-rootfs.tar");
    proc::output(
        Command::new("tar")
            .arg("--numeric-owner")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
    )?;
    let tar_s = tar.to_string_lossy();
    for tag in [BUSYBOX, PAUSE] {
        dockerd.run(&[
            "import",
            "--change",
            r#"CMD ["/bin/sleep", "2147483647"]"#,
            &tar_s,
            tag,
        ])?;
    }
    let archive = work.join("workload-images.tar");
    dockerd.run(&[
        "save",
        "--output",
        &archive.to_string_lossy(),
        BUSYBOX,
        PAUSE,
    ])?;
    Ok(archive)
}

/// One GPU process of the scenario.
pub struct GpuProcess {
    pub pid: u32,
    pub memory: u64,
    pub sm_util: u32,
}

/// Writes the fake NVML scenario (one H100, these processes) atomically: the library
/// re-reads a file whose inode changed.
pub fn write_scenario(path: &Path, procs: &[GpuProcess]) -> Result<()> {
    let processes: Vec<_> = procs
        .iter()
        .map(|p| {
            json!({
                "pid": p.pid,
                "used_memory": p.memory,
                "sm_util": p.sm_util,
                "mem_util": p.sm_util / 2,
            })
        })
        .collect();
    let s = json!({
        "description": "cargo xtask e2e-container: the workload containers' host PIDs",
        "devices": [{
            "uuid": "GPU-5e2e0c0d-7a1b-4c3d-9e8f-0123456789ab",
            "name": "NVIDIA H100 80GB HBM3",
            "index": 0,
            "memory_total": 85_520_809_984u64,
            "utilization_gpu": 60,
            "utilization_memory": 20,
            "power_mw": 350_000,
            "temperature_c": 51,
            "processes": processes,
        }],
    });
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&s)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The name under which dockerd knows the wrapper.
pub const CAPS_RUNTIME: &str = "gpu-agent-caps";

/// Does dockerd know these capabilities by name? dockerd 20.10 (Debian 12's docker.io)
/// does not know CAP_BPF and CAP_PERFMON ("invalid CapAdd: unknown capability"); Docker
/// 23 and later do.
pub fn caps_unknown_to(dockerd: &Dockerd, caps: &[String]) -> Vec<String> {
    caps.iter()
        .filter(|c| {
            let name = format!("e2e-cap-probe-{}", tests::random_hex(6));
            let r = dockerd.run(&[
                "create",
                "--name",
                &name,
                &format!("--cap-add={c}"),
                BUSYBOX,
                "true",
            ]);
            let _ = dockerd.run(&["rm", "-f", &name]);
            matches!(r, Err(e) if e.to_string().contains("unknown capability"))
        })
        .cloned()
        .collect()
}

/// An OCI runtime (runc behind a small wrapper) that adds `caps` to the bounding,
/// effective and permitted sets of the container it creates, and grants a non-root
/// container its bounding set as permitted, as the DaemonSet's `capabilities.add` does
/// through containerd or CRI-O. The agent's container always runs with it; the harness
/// then checks the process's capability sets in /proc against the manifest.
pub fn write_caps_wrapper(dir: &Path, caps: &[String]) -> Result<PathBuf> {
    // Rewritten in place (dockerd knows it by path): write a new file and rename it.
    let runc = on_path("runc").context("runc is not installed: apt-get install runc")?;
    let python = on_path("python3").context("python3 is not installed")?;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("runc-with-caps");
    let log = dir.join("runc-with-caps.log");
    let add: Vec<String> = caps.iter().map(|c| format!("CAP_{c}")).collect();
    let script = format!(
        r#"#!{python}
# Made by `cargo xtask e2e-container`: dockerd 20.10 cannot name {add:?}; this
# adds them to the container's config.json, as the DaemonSet's capabilities.add does
# through a CRI runtime, and runs runc.
import json, os, sys
ADD = {add_json}
args = sys.argv[1:]
bundle = None
for i, a in enumerate(args):
    if a == "--bundle" and i + 1 < len(args):
        bundle = args[i + 1]
    elif a.startswith("--bundle="):
        bundle = a.split("=", 1)[1]
if "create" in args and bundle:
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    caps = spec["process"].setdefault("capabilities", {{}})
    for kind in ("bounding", "effective", "permitted"):
        have = caps.setdefault(kind, [])
        have.extend(c for c in ADD if c not in have)
    # containerd and CRI-O grant a non-root container its added capabilities as permitted
    # (what the image's file capabilities then keep under no-new-privileges); dockerd
    # 20.10.14+ puts them in the bounding set only. Do as the CRI runtimes do.
    # dockerd 20.10's default seccomp profile predates CAP_BPF and CAP_PERFMON: it allows
    # bpf and perf_event_open only with CAP_SYS_ADMIN. Docker 23+, containerd and CRI-O
    # allow them to a container granted those capabilities, as the DaemonSet expects.
    seccomp = spec.get("linux", {{}}).get("seccomp")
    if ADD and seccomp is not None:
        seccomp.setdefault("syscalls", []).append(
            {{"names": ["bpf", "perf_event_open"], "action": "SCMP_ACT_ALLOW"}})
    if spec["process"].get("user", {{}}).get("uid", 0) != 0:
        for kind in ("effective", "permitted"):
            have = caps.setdefault(kind, [])
            have.extend(c for c in caps["bounding"] if c not in have)
    with open(path + ".tmp", "w") as f:
        json.dump(spec, f)
    os.rename(path + ".tmp", path)
    with open({log:?}, "a") as f:
        f.write("%s: added %s\n" % (bundle, " ".join(ADD)))
os.execv({runc:?}, [{runc:?}] + args)
"#,
        python = python.display(),
        add_json = serde_json::to_string(&add)?,
        log = log.display().to_string(),
        runc = runc.display().to_string(),
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, script)?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}
