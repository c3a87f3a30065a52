//! Root podman with runc and the cgroupfs manager, its storage under the harness's
//! directory. Its containers land in `/libpod_parent/libpod-<64-hex id>` on this hybrid
//! host. (crun refuses hybrid cgroups; rootless podman on cgroup v1 creates no cgroups at
//! all, so its containers cannot be told apart: docs/deploy.md.)
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use super::proc::output;
use crate::on_path;

pub struct Podman {
    bin: PathBuf,
    dir: PathBuf,
    /// RLIMIT_NOFILE / RLIMIT_NPROC for containers: podman's defaults exceed this
    /// sandbox's hard limits, and runc cannot raise them (no CAP_SYS_RESOURCE here). Its
    /// own NPROC ends up below the host's hard limit, so a small explicit one.
    nofile: u64,
    nproc: u64,
    started: Vec<String>,
}

impl Podman {
    pub fn new(dir: &Path) -> Result<Podman> {
        let bin = on_path("podman").context(
            "podman is not installed: apt-get install podman (cargo xtask e2e-container \
             installs it when run as root)",
        )?;
        std::fs::create_dir_all(dir)?;
        // Empty: the host's containers.conf and registries do not apply.
        std::fs::write(dir.join("containers.conf"), "")?;
        std::fs::write(dir.join("registries.conf"), "")?;
        let hard = |res| {
            let mut l = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit into a local.
            unsafe { libc::getrlimit(res, &mut l) };
            l.rlim_max.min(1 << 20)
        };
        Ok(Podman {
            bin,
            dir: dir.to_path_buf(),
            nofile: hard(libc::RLIMIT_NOFILE).min(65536),
            nproc: hard(libc::RLIMIT_NPROC).min(4096),
            started: vec![],
        })
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let d = &self.dir;
        let mut c = Command::new(&self.bin);
        c.arg(format!("--root={}", d.join("root").display()))
            .arg(format!("--runroot={}", d.join("run").display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .arg("--cgroup-manager=cgroupfs")
            .arg("--runtime=runc")
            // No journald here.
            .arg("--events-backend=file")
            .arg("--log-level=error")
            // No containers.conf or registries of the caller's.
            .env("CONTAINERS_CONF", d.join("containers.conf"))
            .env("CONTAINERS_REGISTRIES_CONF", d.join("registries.conf"))
            .args(args);
        c
    }

    pub fn run(&self, args: &[&str]) -> Result<String> {
        output(&mut self.cmd(args))
    }

    pub fn version(&self) -> Result<String> {
        self.run(&["version", "--format", "{{.Client.Version}}"])
    }

    /// `podman load` of a `docker save` archive.
    pub fn load(&self, archive: &Path) -> Result<()> {
        self.run(&["load", "--quiet", "--input", &archive.to_string_lossy()])?;
        Ok(())
    }

    /// Starts a detached container; returns (id, host PID).
    pub fn start(&mut self, name: &str, image: &str, command: &[&str]) -> Result<(String, u32)> {
        let nofile = format!("nofile={}:{}", self.nofile, self.nofile);
        let nproc = format!("nproc={}:{}", self.nproc, self.nproc);
        let mut args = vec![
            "run",
            "--detach",
            "--network=none",
            "--ulimit",
            &nofile,
            "--ulimit",
            &nproc,
            "--name",
            name,
            image,
        ];
        args.extend(command);
        let id = self.run(&args)?;
        self.started.push(id.clone());
        let pid = self.run(&["inspect", "--format", "{{.State.Pid}}", &id])?;
        Ok((
            id,
            pid.parse()
                .with_context(|| format!("podman inspect pid {pid:?}"))?,
        ))
    }

    /// Removes the containers and images; the storage directory goes with the work dir.
    pub fn cleanup(&mut self) {
        if !self.started.is_empty() {
            let mut args = vec!["rm", "--force", "--time=0"];
            let ids: Vec<String> = std::mem::take(&mut self.started);
            args.extend(ids.iter().map(String::as_str));
            if let Err(e) = self.run(&args) {
                eprintln!("e2e: removing podman containers: {e}");
            }
        }
        if let Err(e) = self.run(&["rmi", "--all", "--force"]) {
            eprintln!("e2e: removing podman images: {e}");
        }
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        self.cleanup();
    }
}
