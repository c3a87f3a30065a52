//! Hosts without Kubernetes: docs/deploy.md's `docker run` block and deploy/systemd's unit,
//! both held to the rendered DaemonSet by the tests below (run by `cargo xtask test`).
/// Words joined for a shell: bare when safe, `"..."` where they hold `$(hostname)` (to be
/// expanded), `'...'` otherwise.
pub fn shell_words(words: &[String]) -> String {
    words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
}

fn quote(w: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_=./:,@%+".contains(c);
    if !w.is_empty() && w.chars().all(safe) {
        w.to_string()
    } else if w.contains("$(hostname)") && !w.contains(['"', '\\', '`']) {
        format!("\"{w}\"")
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod t {
    use std::collections::BTreeMap;

    use anyhow::Result;

    use super::*;
    use crate::{
        e2e::manifest::{self, AgentSpec, Placement},
        workspace_root,
    };

    /// hostPaths a plain Docker host has no use for: no kubelet, no CRI runtime for pods
    /// (names come from the Docker socket instead).
    pub const NOT_ON_PLAIN_DOCKER: &[&str] = &[
        "/var/lib/kubelet/pod-resources",
        "/run/containerd",
        "/run/crio",
    ];

    /// The DaemonSet's container as one `docker run` on a plain GPU host: the config file in
    /// /etc/gpu-agent, the Docker socket for names, the NVIDIA runtime for NVML.
    pub fn plain_docker_placement() -> Placement {
        Placement {
            node_name: "$(hostname)".into(),
            // Host network: the node-local Collector, if any, listens on the host.
            host_ip: "127.0.0.1".into(),
            image: crate::image::default_tag(),
            name: "gpu-agent".into(),
            host_path: BTreeMap::new(),
            skip_host_paths: NOT_ON_PLAIN_DOCKER.iter().map(|s| s.to_string()).collect(),
            config_dir: BTreeMap::from([("config".to_string(), "/etc/gpu-agent".into())]),
            caps_elsewhere: vec![],
            extra_flags: vec![
                "--mount=type=bind,source=/var/run/docker.sock,target=/var/run/docker.sock,readonly"
                    .into(),
                "--runtime=nvidia".into(),
                "--restart=unless-stopped".into(),
            ],
            extra_env: vec![],
            extra_args: vec![],
            // Root, with the same capability set: Docker (20.10.14 and later) gives a
            // non-root container its added capabilities in the bounding set only, and
            // no-new-privileges then keeps the binary's file capabilities from taking
            // effect. containerd and CRI-O, under the DaemonSet, grant them as permitted.
            user: Some("0:0".into()),
        }
    }

    /// docs/deploy.md's block: `docker run` and one flag per line.
    pub fn plain_docker_command(spec: &AgentSpec) -> Result<String> {
        let args = spec.docker_run_args(&plain_docker_placement())?;
        let image = crate::image::default_tag();
        let at = args
            .iter()
            .position(|a| a == &image)
            .expect("the image is in the args");
        let mut lines = vec!["docker run".to_string()];
        lines.extend(args[..at].iter().map(|a| format!("  {}", quote(a))));
        lines.push(format!("  {}", shell_words(&args[at..])));
        Ok(lines.join(" \\\n"))
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(quote("--pid=host"), "--pid=host");
        assert_eq!(
            quote("--env=NODE_NAME=$(hostname)"),
            "\"--env=NODE_NAME=$(hostname)\""
        );
        assert_eq!(quote("--env=A=$(B)"), "'--env=A=$(B)'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    /// Needs kubectl (or kustomize) on PATH, as the deploy checks do.
    #[test]
    fn the_docs_docker_run_block_is_the_daemonsets_container() {
        let spec = manifest::agent_spec(false).expect("rendering deploy/kubernetes");
        let want = plain_docker_command(&spec).unwrap();
        let doc = std::fs::read_to_string(workspace_root().join("docs/deploy.md")).unwrap();
        assert!(
            doc.contains(&format!("```sh\n{want}\n```")),
            "docs/deploy.md's plain-Docker block differs from the rendered DaemonSet's \
             container (xtask/src/e2e/plain.rs derives it). It should read:\n```sh\n{want}\n```"
        );
    }

    /// deploy/systemd/gpu-agent.service: the DaemonSet's capabilities, arguments, grace
    /// period and memory limit.
    #[test]
    fn the_systemd_unit_matches_the_daemonset() {
        let spec = manifest::agent_spec(false).expect("rendering deploy/kubernetes");
        let unit =
            std::fs::read_to_string(workspace_root().join("deploy/systemd/gpu-agent.service"))
                .unwrap();
        let key = |k: &str| {
            unit.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("gpu-agent.service has no {k}="))
                .trim()
                .to_string()
        };
        let mut caps: Vec<String> = key("CapabilityBoundingSet")
            .split_whitespace()
            .map(|c| c.trim_start_matches("CAP_").to_string())
            .collect();
        caps.sort();
        let mut want = spec.cap_add.clone();
        want.sort();
        assert_eq!(
            caps, want,
            "CapabilityBoundingSet vs the DaemonSet's capabilities.add"
        );
        let exec: Vec<String> = key("ExecStart")
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(
            exec[1..],
            spec.args[..],
            "ExecStart's arguments vs the DaemonSet's args"
        );
        if let Some(g) = spec.termination_grace_secs {
            assert_eq!(key("TimeoutStopSec"), format!("{g}s"));
        }
        if let Some(m) = spec.memory_limit_bytes {
            assert_eq!(key("MemoryMax"), format!("{}M", m >> 20));
        }
        assert_eq!(key("NoNewPrivileges"), "yes");
        assert_eq!(key("ProtectSystem"), "strict", "readOnlyRootFilesystem");
    }
}
