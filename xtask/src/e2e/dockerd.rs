//! Debian's dockerd (docker.io 20.10), started by the harness with a data root, exec root
//! and socket of its own: no bridge, no iptables (none of which this VM allows), the
//! cgroupfs driver (no systemd here), so containers land in `/docker/<64-hex id>`.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result};

use super::proc::{output, Daemon};
use crate::on_path;

pub struct Dockerd {
    daemon: Daemon,
    pub sock: PathBuf,
    cli: PathBuf,
}

/// The docker CLI that ships with the engine (docker.io's /usr/bin/docker): a newer CLI
/// without the buildx plugin cannot drive BuildKit on this engine.
pub fn cli_path() -> Option<PathBuf> {
    let packaged = PathBuf::from("/usr/bin/docker");
    if packaged.is_file() {
        Some(packaged)
    } else {
        on_path("docker")
    }
}

impl Dockerd {
    /// Starts dockerd with its state under `dir`; `runtimes` are extra `--add-runtime
    /// NAME=PATH` entries.
    pub fn start(dir: &Path, runtimes: &[(String, PathBuf)]) -> Result<Dockerd> {
        let bin = on_path("dockerd").context(
            "dockerd is not installed: apt-get install docker.io (cargo xtask e2e-container \
             installs it when run as root)",
        )?;
        let cli =
            cli_path().context("the docker CLI is not installed: apt-get install docker.io")?;
        std::fs::create_dir_all(dir)?;
        let sock = dir.join("docker.sock");
        let mut cmd = Command::new(bin);
        cmd.arg("--bridge=none")
            .arg("--iptables=false")
            .arg("--ip6tables=false")
            .arg("--ip-forward=false")
            .arg("--ip-masq=false")
            .arg("--userland-proxy=false")
            .arg("--exec-opt=native.cgroupdriver=cgroupfs")
            .arg(format!("--data-root={}", dir.join("data").display()))
            .arg(format!("--exec-root={}", dir.join("exec").display()))
            .arg(format!("--pidfile={}", dir.join("docker.pid").display()))
            .arg(format!("--host=unix://{}", sock.display()))
            // An empty config file: /etc/docker/daemon.json of the host does not apply.
            .arg(format!("--config-file={}", empty_config(dir)?.display()));
        for (name, path) in runtimes {
            cmd.arg(format!("--add-runtime={name}={}", path.display()));
        }
        let daemon = Daemon::spawn(
            "dockerd",
            cmd,
            dir.join("dockerd.log"),
            Duration::from_secs(20),
        )?;
        let mut d = Dockerd { daemon, sock, cli };
        let mut probe = d.cmd(&["version", "--format", "{{.Server.Version}}"]);
        d.daemon.wait_ready(Duration::from_secs(60), || {
            probe
                .output()
                .is_ok_and(|o| o.status.success() && !o.stdout.is_empty())
        })?;
        let v = d.run(&["version", "--format", "{{.Server.Version}}"])?;
        eprintln!("e2e: dockerd {v} ready on {}", d.sock.display());
        Ok(d)
    }

    /// A docker CLI command against this daemon.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.cli);
        c.env("DOCKER_HOST", format!("unix://{}", self.sock.display()))
            // No ~/.docker config of the caller's (credential helpers, contexts).
            .env("DOCKER_CONFIG", self.sock.parent().unwrap().join("cli"))
            .env_remove("DOCKER_CONTEXT")
            .args(args);
        c
    }

    /// Runs a docker CLI command; its trimmed stdout.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        output(&mut self.cmd(args))
    }

    pub fn server_version(&self) -> Result<String> {
        self.run(&["version", "--format", "{{.Server.Version}}"])
    }

    /// Removes every container (running ones killed), then stops the daemon.
    pub fn stop(&mut self) {
        if let Ok(ids) = self.run(&["ps", "-aq"]) {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let mut args = vec!["rm", "-f", "-v"];
                args.extend(ids);
                if let Err(e) = self.run(&args) {
                    eprintln!("e2e: removing docker containers: {e}");
                }
            }
        }
        self.daemon.stop();
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn empty_config(dir: &Path) -> Result<PathBuf> {
    let p = dir.join("daemon.json");
    std::fs::write(&p, "{}\n")?;
    Ok(p)
}
