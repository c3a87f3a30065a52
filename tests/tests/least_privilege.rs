//! Least privilege, verified: the agent runs as the DaemonSet runs it by default. The user,
//! the capabilities and allowPrivilegeEscalation are read from
//! deploy/kubernetes/daemonset.yaml, the file capabilities from the `setcap` line of
//! deploy/Dockerfile; the launcher then does what runc does with that securityContext
//! (libcontainer's finalizeNamespace): bounding set = the added capabilities, keep them
//! across setresuid to the user, permitted = effective = those, inheritable and ambient
//! empty (containerd sets no ambient set), no_new_privs, exec. tracefs is mounted in the
//! agent's mount namespace beforehand, as the hostPath shows it on a host that mounts it.
//!
//! The agent must then run in full eBPF mode, attribute every process of a pod, and read
//! names and GPU allocations from root-owned sockets (mode 0660 and 0755, as containerd's
//! and the kubelet's are). Without the image's file capabilities the same launch must fall
//! back to /proc mode and say which capability is missing: the test would notice a
//! launcher that granted more than runc does.
use std::{
    collections::BTreeSet,
    ffi::CString,
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::{json, Value};
use tests::{
    cgroups::{sleeper, systemd_container, Proc, TestCgroup},
    fake_node::{FakeContainer, FakeNode, World},
    fake_nvml_lib, random_hex, random_uid, root, Agent, TempDir as Dir,
};

const GPU: &str = "GPU-00000000-1111-2222-3333-444444444444";

/// The capability numbers of the names the manifests use.
fn cap_number(name: &str) -> u32 {
    let name = name.trim().to_ascii_uppercase();
    let name = name.trim_start_matches("CAP_");
    match name {
        "DAC_OVERRIDE" => 1,
        "DAC_READ_SEARCH" => 2,
        "NET_BIND_SERVICE" => 10,
        "SYS_ADMIN" => 21,
        "SYS_RESOURCE" => 24,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("capability {other}: add its number to this table"),
    }
}

/// What the default DaemonSet's container runs as.
struct Context {
    uid: u32,
    gid: u32,
    caps: BTreeSet<u32>,
    no_new_privs: bool,
}

/// This process's bounding set: what any launcher here can grant at most.
fn own_bounding_set() -> u64 {
    u64::from_str_radix(&status_field(std::process::id(), "CapBnd:"), 16).unwrap()
}

fn daemonset_context() -> Context {
    let file = root().join("deploy/kubernetes/daemonset.yaml");
    let ds: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&file).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let sc = &c["securityContext"];
    let num = |k: &str| {
        sc[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: securityContext.{k} is not set", file.display()))
            as u32
    };
    let added = sc["capabilities"]["add"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        sc["capabilities"]["drop"],
        serde_yaml::from_str::<serde_yaml::Value>("[ALL]").unwrap(),
        "{}: capabilities.drop must be [ALL]",
        file.display()
    );
    Context {
        uid: num("runAsUser"),
        gid: num("runAsGroup"),
        caps: added
            .iter()
            .map(|c| cap_number(c.as_str().unwrap()))
            .collect(),
        no_new_privs: sc["allowPrivilegeEscalation"] == false,
    }
}

/// The Dockerfile's `setcap CAPS+FLAGS /usr/local/bin/gpu-agent`: (capabilities, effective).
fn image_file_caps() -> (BTreeSet<u32>, bool) {
    let file = root().join("deploy/Dockerfile");
    let text = std::fs::read_to_string(&file).unwrap();
    let spec = text
        .split_whitespace()
        .skip_while(|w| *w != "setcap")
        .nth(1)
        .unwrap_or_else(|| panic!("{}: no setcap", file.display()));
    let (caps, flags) = spec.split_once('+').expect("setcap CAPS+FLAGS");
    assert!(
        flags.contains('p') && !flags.contains('i'),
        "{}: setcap {spec}",
        file.display()
    );
    (
        caps.split(',').map(cap_number).collect(),
        flags.contains('e'),
    )
}

/// Sets security.capability (VFS_CAP_REVISION_2) on `path`, as setcap does.
fn set_file_caps(path: &Path, caps: &BTreeSet<u32>, effective: bool) {
    let bits: u64 = caps.iter().map(|c| 1u64 << c).sum();
    let magic: u32 = 0x0200_0000 | u32::from(effective);
    let mut data = Vec::with_capacity(20);
    for word in [magic, bits as u32, 0, (bits >> 32) as u32, 0] {
        data.extend_from_slice(&word.to_le_bytes());
    }
    let p = CString::new(path.to_str().unwrap()).unwrap();
    let name = CString::new("security.capability").unwrap();
    // SAFETY: valid NUL-terminated strings and a 20-byte buffer.
    let rc = unsafe { libc::setxattr(p.as_ptr(), name.as_ptr(), data.as_ptr().cast(), 20, 0) };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
}

fn copy_to(dir: &Dir, from: &Path, mode: u32) -> PathBuf {
    let to = dir.0.join(from.file_name().unwrap());
    std::fs::copy(from, &to).unwrap();
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).unwrap();
    to
}

/// The agent started as runc starts the DaemonSet's container.
fn launch(bin: &Path, ctx: &Context, config: &Path, env: &[(&str, &str)]) -> Agent {
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--http-addr", "127.0.0.1:0", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let last_cap: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (uid, gid, keep, nnp) = (ctx.uid, ctx.gid, ctx.caps.clone(), ctx.no_new_privs);
    let bits: u64 = keep.iter().map(|c| 1u64 << c).sum();
    let tracing = CString::new("/sys/kernel/tracing").unwrap();
    let tracefs = CString::new("tracefs").unwrap();
    let slash = CString::new("/").unwrap();
    // SAFETY: raw syscalls only between fork and exec; nothing allocates.
    unsafe {
        cmd.pre_exec(move || {
            let check = |rc: libc::c_long| match rc {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            };
            // The host's tracefs, in a mount namespace of the agent's own.
            check(libc::unshare(libc::CLONE_NEWNS).into())?;
            let flags = libc::MS_REC | libc::MS_PRIVATE;
            let (none, no_data) = (std::ptr::null(), std::ptr::null());
            check(libc::mount(none, slash.as_ptr(), none, flags, no_data).into())?;
            let fs = tracefs.as_ptr();
            // EBUSY: tracefs is mounted there already (most distributions do): that one
            // is the host's too, and visible here.
            if libc::mount(fs, tracing.as_ptr(), fs, 0, no_data) != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EBUSY) {
                    return Err(e);
                }
            }
            for cap in (0..=last_cap).filter(|c| !keep.contains(c)) {
                check(libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0).into())?;
            }
            check(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0).into())?;
            let no_groups: *const libc::gid_t = std::ptr::null();
            check(libc::syscall(libc::SYS_setgroups, 0, no_groups))?;
            check(libc::syscall(libc::SYS_setresgid, gid, gid, gid))?;
            check(libc::syscall(libc::SYS_setresuid, uid, uid, uid))?;
            let header = [0x2008_0522u32, 0];
            let (lo, hi) = (bits as u32, (bits >> 32) as u32);
            let data = [lo, lo, 0, hi, hi, 0];
            check(libc::syscall(
                libc::SYS_capset,
                header.as_ptr(),
                data.as_ptr(),
            ))?;
            if nnp {
                check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into())?;
            }
            Ok(())
        });
    }
    Agent::spawn(cmd, None)
}

fn status_field(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn wait_snapshot(agent: &Agent, what: &str, pred: impl FnMut(&Value) -> bool) -> Value {
    agent.wait_snapshot(Duration::from_secs(25), what, pred)
}

#[test]
#[ignore = "needs root: sets file capabilities, loads the eBPF programs, creates pod cgroups"]
fn the_default_daemonset_runs_non_root_in_full_ebpf_mode() {
    let ctx = daemonset_context();
    assert_ne!(
        ctx.uid, 0,
        "deploy/kubernetes/daemonset.yaml: runAsUser must not be root"
    );
    assert!(ctx.no_new_privs, "allowPrivilegeEscalation must be false");
    let (file_caps, effective) = image_file_caps();
    let missing: Vec<_> = ctx.caps.difference(&file_caps).collect();
    assert!(
        missing.is_empty(),
        "the DaemonSet adds capabilities {missing:?} that the image's setcap does not grant: \
         a non-root agent never gets them"
    );

    // What the kernel needs on any version is granted for sure; SYS_RESOURCE (RLIMIT_MEMLOCK
    // before 5.11) is not available to every sandbox running this test, and it is not used on
    // kernels that charge BPF memory to the cgroup.
    let own = own_bounding_set();
    let mut ctx = ctx;
    let unavailable: Vec<u32> = ctx
        .caps
        .iter()
        .copied()
        .filter(|c| own & (1 << c) == 0)
        .collect();
    for c in &unavailable {
        assert_eq!(
            *c,
            cap_number("SYS_RESOURCE"),
            "capability {c} is not available to this test"
        );
        eprintln!("capability {c} (SYS_RESOURCE) is not in this test's bounding set: left out");
        ctx.caps.remove(c);
    }
    let dir = Dir::new("gpu-agent-nonroot");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plain = copy_to(&dir, &tests::agent_binary(), 0o755);
    let image = dir.0.join("gpu-agent-image");
    std::fs::copy(&plain, &image).unwrap();
    set_file_caps(&image, &file_caps, effective);
    let lib = copy_to(&dir, &fake_nvml_lib(), 0o644);

    // A pod with five processes, two started after the agent; one of them on the GPU.
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let mut procs: Vec<Proc> = (0..3).map(|_| Proc(cg.spawn(&mut sleeper()))).collect();
    let scenario = dir.0.join("nvml.json");
    let gpu = |pid: u32| {
        json!({"devices": [{"index": 0, "uuid": GPU, "name": "NVIDIA H100 80GB HBM3",
            "memory_total": 85520809984u64, "memory_used": 1u64 << 30, "utilization_gpu": 20,
            "utilization_memory": 1, "processes": [{"pid": pid, "used_memory": 1u64 << 30,
            "sm_util": 20, "mem_util": 1, "enc_util": 0, "dec_util": 0}]}]})
    };
    std::fs::write(&scenario, gpu(procs[0].pid()).to_string()).unwrap();
    // The node's sockets, owned by root as containerd's (0660) and the kubelet's (0755) are.
    let world = World::default();
    world.set(vec![FakeContainer {
        id: id.clone(),
        pod_uid: uid.clone(),
        namespace: "ml".into(),
        pod: "trainer-0".into(),
        name: "main".into(),
        gpus: vec![GPU.into()],
    }]);
    let node = FakeNode::start(&dir.0, world);
    std::fs::set_permissions(&node.cri, std::fs::Permissions::from_mode(0o660)).unwrap();
    std::fs::set_permissions(&node.pod_resources, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.0.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[nvml]\ninterval_ms = 200\nlib_path = \"{}\"\n[metadata]\ncri_socket = \"{}\"\n\
             pod_resources_socket = \"{}\"\nallocation_interval_secs = 1\n",
            lib.display(),
            node.cri.display(),
            node.pod_resources.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let env = [("FAKE_NVML_SCENARIO", scenario.to_str().unwrap())];

    let agent = launch(&image, &ctx, &config, &env);
    let pid = agent.pid();
    assert_eq!(
        status_field(pid, "Uid:").split_whitespace().next(),
        Some("65534")
    );
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    let want: u64 = ctx.caps.iter().map(|c| 1u64 << c).sum();
    let eff = u64::from_str_radix(&status_field(pid, "CapEff:"), 16).unwrap();
    assert_eq!(
        eff,
        want,
        "CapEff {eff:#x}, the DaemonSet adds {want:#x}\n{}",
        agent.log()
    );
    let stats = agent.stats();
    assert_eq!(stats["mode"], "ebpf", "{stats}\n{}", agent.log());
    assert_eq!(stats["degraded_reason"], Value::Null, "{stats}");
    // The DaemonSet's capabilities also let the kernel list its tasks at start-up.
    assert_eq!(
        stats["startup_source"],
        "task_iterator",
        "{stats}\n{}",
        agent.log()
    );
    procs.extend((0..2).map(|_| Proc(cg.spawn(&mut sleeper()))));
    for p in &procs {
        agent.wait_for_process(p.pid(), "container_id", &json!(id));
    }
    let snap = wait_snapshot(&agent, "the pod's name and allocation", |s| {
        s["containers"].as_array().into_iter().flatten().any(|c| {
            c["container_id"] == json!(id)
                && c["pod_name"] == "trainer-0"
                && c["allocated_gpus"] == json!([GPU])
        })
    });
    assert!(snap["containers"].is_array());
    drop(agent);

    // The same launch without the image's file capabilities: /proc mode, and it says why.
    let agent = launch(&plain, &ctx, &config, &env);
    let stats = agent.stats();
    assert_eq!(stats["mode"], "procfs", "{stats}");
    let reason = stats["degraded_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("CAP_BPF"), "{reason}");
    assert_eq!(status_field(agent.pid(), "CapEff:"), "0000000000000000");
}
