//! The eBPF process cache against ground truth, in the running kernel: real programs, real
//! cgroups shaped like kubelet's (systemd and cgroupfs drivers), real processes.
use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::{json, Value};
use tests::{
    cgroups::{
        cgroupfs_container, first_child, proc_cgroup, sleeper, spawn_with_pid, systemd_container,
        Proc, TestCgroup,
    },
    random_hex, random_uid, Agent,
};

fn assert_attributed(row: &Value, id: &str, uid: &str) {
    assert_eq!(row["container_id"], json!(id), "{row}");
    assert_eq!(row["pod_uid"], json!(uid), "{row}");
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn process_started_before_the_agent_is_found_by_the_startup_walk() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let p = Proc(cg.spawn(&mut sleeper()));
    let agent = Agent::start("");
    let stats = agent.stats();
    assert_eq!(stats["mode"], "ebpf", "{stats}\n{}", agent.log());
    let row = agent
        .process(p.pid())
        .unwrap_or_else(|| panic!("pid {} missing\n{}", p.pid(), agent.log()));
    assert_attributed(&row, &id, &uid);
    assert_eq!(row["qos"], "burstable");
    assert_eq!(row["runtime"], "containerd");
    assert_eq!(row["cgroup_path"], json!(cg.path));
    assert_eq!(row["comm"], "sleep");
    // Ground truth: the kernel's own view of the process.
    assert_eq!(proc_cgroup(p.pid(), "0").as_deref(), Some(cg.path.as_str()));
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&cg.dir).unwrap());
    assert_eq!(row["cgroup_id"], json!(ino));
}

/// The agent's config with the process programs on the classic tracepoints.
const CLASSIC: &str = "[ebpf]\nbtf_tracepoints = false\n";

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn new_exec_and_fork_without_exec_inherit_the_pod() {
    exec_and_fork_inherit_the_pod("");
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn the_classic_tracepoints_follow_exec_and_fork_too() {
    exec_and_fork_inherit_the_pod(CLASSIC);
}

fn exec_and_fork_inherit_the_pod(config: &str) {
    let agent = Agent::start(config);
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&cgroupfs_container(&uid, &id));
    // A Python worker that forks and never execs: the child must be attributed too.
    let mut cmd = Command::new("python3");
    cmd.args([
        "-c",
        "import os,sys,time\npid=os.fork()\nif pid==0:\n    time.sleep(600)\nelse:\n    print(pid, flush=True)\n    time.sleep(600)\n",
    ])
    .stdout(Stdio::piped());
    let mut parent = Proc(cg.spawn(&mut cmd));
    let mut line = String::new();
    BufReader::new(parent.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let child: u32 = line.trim().parse().expect("child pid");
    for pid in [parent.pid(), child] {
        let row = agent.wait_for_process(pid, "container_id", &json!(id));
        assert_attributed(&row, &id, &uid);
        assert_eq!(row["qos"], "besteffort");
        assert_eq!(
            row["runtime"],
            Value::Null,
            "cgroupfs cannot tell the runtime"
        );
    }
    let row = agent.process(child).unwrap();
    assert_eq!(row["ppid"], json!(parent.pid()));
    assert_eq!(row["comm"], "python3");
    // SAFETY: the forked child is ours to kill.
    unsafe { libc::kill(child as i32, libc::SIGKILL) };
    agent.wait_until(
        "the forked child to leave the cache",
        Duration::from_secs(10),
        || agent.process(child).is_none(),
    );
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn migration_into_a_pod_cgroup_is_followed() {
    let agent = Agent::start("");
    let p = Proc(sleeper().spawn().unwrap());
    let before = agent.wait_for_process(p.pid(), "comm", &json!("sleep"));
    assert_eq!(before["container_id"], Value::Null);
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    cg.add(p.pid());
    let row = agent.wait_for_process(p.pid(), "container_id", &json!(id));
    assert_attributed(&row, &id, &uid);
    assert_eq!(proc_cgroup(p.pid(), "0").as_deref(), Some(cg.path.as_str()));
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn process_in_its_own_pid_namespace_is_seen_by_host_pid() {
    let agent = Agent::start("");
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "sleep", "600"]);
    let outer = Proc(cg.spawn(&mut cmd));
    // The payload is unshare's child: PID 1 in its namespace, another PID on the host.
    let inner = first_child(outer.pid());
    let status = std::fs::read_to_string(format!("/proc/{inner}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert!(
        nspid.ends_with("\t1"),
        "inner process is PID 1 in its namespace: {nspid}"
    );
    let row = agent.wait_for_process(inner, "container_id", &json!(id));
    assert_attributed(&row, &id, &uid);
    assert_eq!(row["pid"], json!(inner), "keyed by the host PID");
    assert!(agent.process(1).is_none_or(|r| r["container_id"].is_null()));
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn plain_docker_scope_is_a_docker_container() {
    let agent = Agent::start("");
    let id = random_hex(64);
    let cg = TestCgroup::v2(&format!("/system.slice/docker-{id}.scope"));
    let p = Proc(cg.spawn(&mut sleeper()));
    let row = agent.wait_for_process(p.pid(), "container_id", &json!(id));
    assert_eq!(row["runtime"], "docker");
    assert_eq!(row["pod_uid"], Value::Null);
    assert_eq!(row["qos"], Value::Null);
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates cgroup v1 and v2 cgroups"]
fn process_only_in_a_cgroup_v1_hierarchy_is_attributed() {
    let (uid, id) = (random_uid(), random_hex(64));
    let path = format!("/kubepods/burstable/pod{uid}/{id}");
    let cg = TestCgroup::v1_memory(&path).expect(
        "no cgroup v1 memory hierarchy on this host: this test needs a hybrid host \
         (`cargo xtask test` leaves it out on pure cgroup v2 hosts)",
    );
    let agent = Agent::start("");
    // Started before: the walk must place it. Moved after: the attach event must.
    let before = Proc(sleeper().spawn().unwrap());
    cg.add(before.pid());
    let agent2 = Agent::start("");
    let after = Proc(sleeper().spawn().unwrap());
    agent.wait_for_process(after.pid(), "comm", &json!("sleep"));
    cg.add(after.pid());
    // A fork inside the v1 cgroup inherits it in the kernel map.
    let mut sh = Command::new("sh");
    sh.args(["-c", "sleep 600"]);
    let forked = Proc(cg.spawn(&mut sh));
    for (a, pid) in [
        (&agent, after.pid()),
        (&agent, forked.pid()),
        (&agent2, before.pid()),
        (&agent, before.pid()),
    ] {
        assert_eq!(
            proc_cgroup(pid, "0").as_deref(),
            Some("/"),
            "pid {pid} stays in the cgroup2 root"
        );
        let row = a.wait_for_process(pid, "container_id", &json!(id));
        assert_attributed(&row, &id, &uid);
        assert_eq!(row["cgroup_version"], 1);
        assert_eq!(row["cgroup_path"], json!(path));
    }
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn an_exited_process_its_parent_has_not_reaped_stays_exited() {
    // Each child moves itself into the pod (an attach, as runc does), execs and exits; the
    // agent reads the fork, attach and exit in one batch while the child is a zombie,
    // still in /proc. Reading the zombie back from /proc would bring back, in the cache
    // and in the kernel map, a process whose exit was already applied. 64 KiB of ring,
    // read once a second: the twenty children's notifications (about 14 KiB) fit, and a
    // burst of migrations overflows it later.
    let agent = Agent::start(
        "[ebpf]\nring_buffer_bytes = 65536\nwakeup_bytes = 65536\npoll_interval_ms = 1000\n",
    );
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let mut zombies: Vec<std::process::Child> = (0..20)
        .map(|_| cg.spawn(&mut Command::new("true")))
        .collect();
    let pids: Vec<u32> = zombies.iter().map(|c| c.id()).collect();
    for &pid in &pids {
        wait_for_zombie(pid);
    }
    // Notifications are applied in order: once a later process shows, the zombies' batch
    // has been applied.
    let marker = Proc(cg.spawn(&mut sleeper()));
    agent.wait_for_process(marker.pid(), "container_id", &json!(id));
    let ghosts = |agent: &Agent| -> Vec<u32> {
        let live: BTreeSet<u32> = agent
            .processes()
            .iter()
            .map(|r| r["pid"].as_u64().unwrap() as u32)
            .collect();
        pids.iter().copied().filter(|p| live.contains(p)).collect()
    };
    assert_eq!(
        ghosts(&agent),
        Vec::<u32>::new(),
        "exited, yet live\n{}",
        agent.log()
    );
    for z in &mut zombies {
        z.wait().unwrap();
    }
    // A resync reads the kernel map back: no entry of theirs may be left in it. Migrations
    // overflow the ring cheaply (552 bytes a notification, no fork), even under emulation.
    let other = TestCgroup::v2(&systemd_container(&uid, &random_hex(64)));
    let resyncs = |agent: &Agent| agent.stats()["resyncs"].as_u64().unwrap();
    let before = resyncs(&agent);
    for round in 0.. {
        for _ in 0..50 {
            other.add(marker.pid());
            cg.add(marker.pid());
        }
        if resyncs(&agent) > before {
            break;
        }
        assert!(
            round < 100,
            "no resync after {round} rounds\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        ghosts(&agent),
        Vec::<u32>::new(),
        "back after a resync\n{}",
        agent.log()
    );
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn a_zombie_older_than_the_agent_is_not_a_live_process() {
    // Its exit was before the programs were attached: no notification will ever say it,
    // so the start-up walk must not take it for a running process.
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let mut zombie = cg.spawn(&mut Command::new("true"));
    let pid = zombie.id();
    wait_for_zombie(pid);
    let running = Proc(cg.spawn(&mut sleeper()));
    for config in ["", "[ebpf]\ntask_iterator = false\n"] {
        let agent = Agent::start(config);
        let row = agent.wait_for_process(running.pid(), "container_id", &json!(id));
        assert_attributed(&row, &id, &uid);
        assert!(
            agent.process(pid).is_none(),
            "the zombie {pid} is live ({config:?})\n{}",
            agent.log()
        );
    }
    zombie.wait().unwrap();
}

/// Waits until our unreaped child `pid` has exited: a zombie, still in /proc.
fn wait_for_zombie(pid: u32) {
    let deadline = std::time::Instant::now() + tests::slow(Duration::from_secs(10));
    while proc_stat(pid).unwrap().state != 'Z' {
        assert!(std::time::Instant::now() < deadline, "{pid} never exited");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs root: loads the eBPF programs, creates pod cgroups and writes ns_last_pid"]
fn reused_pid_is_a_new_process_in_its_new_pod() {
    let agent = Agent::start("[cache]\ntombstone_secs = 30\n");
    let (uid_a, id_a) = (random_uid(), random_hex(64));
    let (uid_b, id_b) = (random_uid(), random_hex(64));
    let a = TestCgroup::v2(&systemd_container(&uid_a, &id_a));
    let b = TestCgroup::v2(&cgroupfs_container(&uid_b, &id_b));
    // The tests beside this one fork too, and one of theirs may take the freed PID first:
    // then it starts again with another.
    let (row_a, second) = (0..10)
        .find_map(|_| {
            let first = Proc(a.spawn(&mut sleeper()));
            let pid = first.pid();
            let row_a = agent.wait_for_process(pid, "container_id", &json!(id_a));
            drop(first);
            agent.wait_until("the exit", Duration::from_secs(10), || {
                agent.process(pid).is_none()
            });
            let tomb = agent.json("/debug/processes?all=true");
            assert!(
                tomb.as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["pid"] == json!(pid) && r["exited"] == json!(true)),
                "a tombstone stays joinable"
            );
            spawn_with_pid(pid, &b).map(|second| (row_a, second))
        })
        .expect("ten freed PIDs were all taken by other processes first");
    let row_b = agent.wait_for_process(second.pid(), "container_id", &json!(id_b));
    assert_attributed(&row_b, &id_b, &uid_b);
    assert_eq!(row_b["exited"], false);
    assert_ne!(
        row_a["start_time_ns"], row_b["start_time_ns"],
        "another identity"
    );
}

/// A process exits and the next process of its PID forks within one drain of the ring:
/// the exit, read in the same batch, must end only the first (a reordering of exits, such
/// as batching exits per CPU, would end the second).
#[test]
#[ignore = "needs root: loads the eBPF programs, creates pod cgroups and writes ns_last_pid"]
fn a_late_exit_does_not_end_the_next_process_of_its_pid() {
    // One drain every 3 s, and no early wake-up: the exit and the next fork of its PID
    // nearly always fall between two drains.
    let agent = Agent::start(
        "[ebpf]\npoll_interval_ms = 3000\nwakeup_bytes = 524288\nring_buffer_bytes = 1048576\n",
    );
    let (uid_a, id_a) = (random_uid(), random_hex(64));
    let (uid_b, id_b) = (random_uid(), random_hex(64));
    let a = TestCgroup::v2(&systemd_container(&uid_a, &id_a));
    let b = TestCgroup::v2(&systemd_container(&uid_b, &id_b));
    for round in 0..3 {
        // The tests beside this one fork too, and one of theirs may take the freed PID
        // first: then the round starts again with another.
        let (pid, second) = (0..10)
            .find_map(|_| {
                let first = Proc(a.spawn(&mut sleeper()));
                let pid = first.pid();
                agent.wait_for_process(pid, "container_id", &json!(id_a));
                drop(first);
                spawn_with_pid(pid, &b).map(|second| (pid, second))
            })
            .expect("ten freed PIDs were all taken by other processes first");
        let row = agent.wait_for_process(second.pid(), "container_id", &json!(id_b));
        assert_attributed(&row, &id_b, &uid_b);
        // Two more drains: the first process's exit has been read by then.
        std::thread::sleep(tests::slow(Duration::from_millis(6500)));
        let row = agent.process(pid);
        assert!(
            row.as_ref()
                .is_some_and(|r| r["container_id"] == json!(id_b)),
            "round {round}: the second process of pid {pid} is not live: {row:?}\n{}",
            agent.log()
        );
        drop(second);
        agent.wait_until("the second exit", Duration::from_secs(10), || {
            agent.process(pid).is_none()
        });
    }
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn ring_buffer_overflow_is_repaired_by_a_resync() {
    overflow_then_resync("", 40, None);
}

#[test]
#[ignore = "needs root: loads the eBPF programs, creates pod cgroups and writes ns_last_pid"]
fn a_resync_reads_processes_whose_slot_another_holds() {
    // 1,024 slots: processes whose tgids are 1,024 apart share one, and the later one has
    // its entry in the hash map beside the slots. The resync must read both, and the exits
    // must free both.
    let (_cg, keepers) = overflow_then_resync("max_processes = 1024\n", 40, Some(1024));
    let mut by_slot: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for p in &keepers {
        by_slot.entry(p.pid() & 1023).or_default().push(p.pid());
    }
    let shared = by_slot.values().filter(|pids| pids.len() > 1).count();
    assert!(shared >= 10, "{shared} slots shared: {by_slot:?}");
}

/// A storm that overflows a one-page ring; then the cache must be the pod's live processes
/// exactly. With `slots`, 20 more long-lived processes get the tgids of the 11th to 30th
/// plus a multiple of it (the same slot). Returns the pod's cgroup and the processes kept
/// alive (killed when dropped).
fn overflow_then_resync(ebpf: &str, keep_n: usize, slots: Option<u32>) -> (TestCgroup, Vec<Proc>) {
    // One page of ring buffer, no early wake-ups and a slow consumer: a storm must overflow.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let agent = Agent::start(&format!(
        "[ebpf]\n{ebpf}ring_buffer_bytes = {page}\nwakeup_bytes = {page}\npoll_interval_ms = 1500\n"
    ));
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    // Long-lived processes to find afterwards, short-lived ones to flood the ring, and a
    // few long-lived ones killed in the storm: the resync must forget exactly those.
    let mut keep: Vec<Proc> = (0..keep_n)
        .map(|_| Proc(cg.spawn(&mut sleeper())))
        .collect();
    if let Some(n) = slots {
        let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let sharers: Vec<Proc> = keep[10..30]
            .iter()
            .map(|p| {
                let free = (1..pid_max / n)
                    .flat_map(|k| [p.pid() + k * n, p.pid().saturating_sub(k * n)])
                    .filter(|w| {
                        (301..pid_max).contains(w) && !Path::new(&format!("/proc/{w}")).exists()
                    });
                // The tests beside this one fork too: a free tgid may go to one of theirs
                // first, and then the next free one of the slot is tried.
                free.take(5)
                    .find_map(|want| spawn_with_pid(want, &cg))
                    .unwrap_or_else(|| panic!("no process got a tgid in {}'s slot", p.pid()))
            })
            .collect();
        keep.extend(sharers);
    }
    let keep_n = keep.len();
    for _ in 0..300 {
        let mut c = Command::new("true");
        cg.spawn(&mut c).wait().unwrap();
    }
    let killed: Vec<u32> = keep.drain(..10).map(|p| p.pid()).collect(); // dropped: killed
    let truth: BTreeSet<u32> = cg.procs().into_iter().collect();
    assert_eq!(truth.len(), keep_n - 10);
    agent.wait_until("a resync", Duration::from_secs(15), || {
        agent.stats()["resyncs"].as_u64().unwrap_or(0) >= 1
    });
    let stats = agent.stats();
    assert!(stats["events_lost"].as_u64().unwrap() > 0, "{stats}");
    // The cache must now hold exactly the pod's live processes, all attributed.
    let deadline = std::time::Instant::now() + tests::slow(Duration::from_secs(10));
    loop {
        let seen: BTreeSet<u32> = agent
            .processes()
            .iter()
            .filter(|r| r["pod_uid"] == json!(uid))
            .map(|r| r["pid"].as_u64().unwrap() as u32)
            .collect();
        if seen == truth {
            break;
        }
        if std::time::Instant::now() > deadline {
            // What /proc says of each process the cache has wrong (gone: None).
            let wrong: Vec<(u32, Option<char>)> = seen
                .symmetric_difference(&truth)
                .map(|&p| (p, proc_stat(p).map(|s| s.state)))
                .collect();
            panic!(
                "the cache never matched the kernel: missing {:?}, extra {:?}, their state \
                 {wrong:?}\nstats {}\nagent log:\n{}",
                truth.difference(&seen).collect::<Vec<_>>(),
                seen.difference(&truth).collect::<Vec<_>>(),
                agent.stats(),
                agent.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for pid in killed {
        assert!(agent.process(pid).is_none(), "killed pid {pid} still live");
    }
    for p in &keep {
        assert_attributed(&agent.process(p.pid()).unwrap(), &id, &uid);
    }
    (cg, keep)
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn cache_matches_proc_for_every_process() {
    let agent = Agent::start("");
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let _ps: Vec<Proc> = (0..5).map(|_| Proc(cg.spawn(&mut sleeper()))).collect();
    std::thread::sleep(Duration::from_millis(500));
    // Every process alive both well before the query (past the consumer's poll interval:
    // notifications are batched) and after it, in the same cgroup both times, must be in the
    // cache, in that cgroup. Other tests run beside this one and move processes between pod
    // cgroups: one moved around the query has no single truth to compare.
    let before = cgroups_now();
    std::thread::sleep(Duration::from_millis(1000));
    let rows = agent.processes();
    let after = cgroups_now();
    let mut mismatches = vec![];
    for (pid, (start, truth)) in &before {
        if after.get(pid) != Some(&(*start, truth.clone())) {
            continue;
        }
        let Some(row) = rows.iter().find(|r| r["pid"] == json!(pid)) else {
            mismatches.push(format!("{pid}: missing"));
            continue;
        };
        if row["cgroup_version"] == 2 && truth.is_some() && row["cgroup_path"] != json!(truth) {
            mismatches.push(format!("{pid}: {} vs {truth:?}", row["cgroup_path"]));
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:?}");
}

/// Both start-up sources, the kernel's task iterator (the default) and /proc
/// (`ebpf.task_iterator = false`), give every process that predates the agent the parent,
/// start time, command and cgroups that /proc gives.
#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn both_startup_sources_agree_with_proc() {
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let _ps: Vec<Proc> = (0..3).map(|_| Proc(cg.spawn(&mut sleeper()))).collect();
    // On hybrid hosts, one process in a v1 memory cgroup only (its cgroup2 is the root).
    let v1_path = format!("/kubepods/burstable/pod{}/{}", random_uid(), random_hex(64));
    let v1 = TestCgroup::v1_memory(&v1_path);
    let in_v1 = v1.as_ref().map(|cg| {
        let p = Proc(sleeper().spawn().unwrap());
        cg.add(p.pid());
        p
    });
    // What the start-up walk is about: the processes older than both agents.
    let facts = |pid: u32| {
        let s = proc_stat(pid)?;
        Some(((s.ppid, s.start_ns, s.comm), proc_cgroup(pid, "0")))
    };
    let before: Vec<(u32, _)> = procs_now()
        .into_iter()
        .filter_map(|pid| Some((pid, facts(pid)?)))
        .collect();
    let iterated = Agent::start("");
    let walked = Agent::start("[ebpf]\ntask_iterator = false\n");
    for (agent, source) in [(&iterated, "task_iterator"), (&walked, "procfs")] {
        let stats = agent.stats();
        assert_eq!(stats["startup_source"], source, "{stats}\n{}", agent.log());
    }
    let rows = [
        ("task_iterator", iterated.processes()),
        ("procfs", walked.processes()),
    ];
    let after = procs_now();
    let mut mismatches = vec![];
    let mut checked = 0;
    for (pid, then) in &before {
        // What changed while the test ran (a parent that exited, an exec, a move) is the
        // notifications' business, not the start-up walk's.
        if !after.contains(pid) || facts(*pid).as_ref() != Some(then) {
            continue;
        }
        let ((ppid, start_ns, comm), cgroup) = then.clone();
        for (source, rows) in &rows {
            let Some(row) = rows.iter().find(|r| r["pid"] == json!(pid)) else {
                mismatches.push(format!("{source} {pid} ({comm}, parent {ppid}): missing"));
                continue;
            };
            checked += 1;
            let start = row["start_time_ns"].as_u64().unwrap_or(0);
            // /proc names a kernel worker with its current workqueue ("kworker/0:1-events",
            // "kworker/0:1+events"): kernel threads (children of kthreadd) are not compared.
            let same_comm = ppid == 2 || row["comm"] == json!(comm);
            let same_cgroup = row["cgroup_version"] != 2 || row["cgroup_path"] == json!(cgroup);
            if row["ppid"] != json!(ppid)
                || start.abs_diff(start_ns) > 20_000_000
                || !same_comm
                || !same_cgroup
            {
                mismatches.push(format!(
                    "{source} {pid}: {row} vs /proc {ppid} {start_ns} {comm} {cgroup:?}"
                ));
            }
        }
    }
    assert!(checked > 20, "only {checked} rows compared");
    if let Some(p) = &in_v1 {
        for (source, rows) in &rows {
            let row = rows.iter().find(|r| r["pid"] == json!(p.pid()));
            let row = row.unwrap_or_else(|| panic!("{source}: pid {} missing", p.pid()));
            assert_eq!(row["cgroup_version"], 1, "{source}: {row}");
            assert_eq!(row["cgroup_path"], json!(v1_path), "{source}: {row}");
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

/// What /proc/PID/stat says of a process.
struct Stat {
    state: char,
    ppid: u32,
    /// Nanoseconds since boot.
    start_ns: u64,
    comm: String,
}

fn proc_stat(pid: u32) -> Option<Stat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command is in parentheses and may hold any byte: the fields follow the last ")".
    let (head, rest) = stat.rsplit_once(") ")?;
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f.get(19)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        start_ns: ticks * 1_000_000_000 / hz,
        comm: head.split_once(" (")?.1.to_string(),
    })
}

/// Live processes: zombies are left out, since they have exited (the agent keeps a tombstone)
/// and their cgroup may already be removed ("... (deleted)" in /proc/PID/cgroup).
/// Each live process's start time and cgroup v2 path.
fn cgroups_now() -> std::collections::BTreeMap<u32, (u64, Option<String>)> {
    procs_now()
        .into_iter()
        .filter_map(|pid| Some((pid, (proc_stat(pid)?.start_ns, proc_cgroup(pid, "0")))))
        .collect()
}

fn procs_now() -> BTreeSet<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid| proc_stat(*pid).is_some_and(|s| s.state != 'Z'))
        .collect()
}

/// `struct clone_args` as far as its `cgroup` field (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// A child of this process born in `cg` (`clone3` with `CLONE_INTO_CGROUP`), not in this
/// process's cgroup: it never execs, and waits for its SIGKILL.
fn clone_into(cg: &TestCgroup) -> u32 {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(&cg.dir).expect("the cgroup's directory");
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: dir.as_raw_fd() as u64,
        ..Default::default()
    };
    // SAFETY: no CLONE_VM: the child has its own copy of memory, and only calls pause(),
    // which is async-signal-safe, until it is killed.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid == 0 {
        loop {
            // SAFETY: async-signal-safe.
            unsafe { libc::pause() };
        }
    }
    assert!(pid > 0, "clone3: {}", std::io::Error::last_os_error());
    pid as u32
}

/// A process born into a pod's cgroup by `clone3(CLONE_INTO_CGROUP)` is in that pod from
/// its first notification: its parent's cgroup is not its own.
fn a_child_cloned_into_a_pod_is_in_it(config: &str) {
    let agent = Agent::start(config);
    let (uid, id) = (random_uid(), random_hex(64));
    let cg = TestCgroup::v2(&systemd_container(&uid, &id));
    let child = clone_into(&cg);
    let cleanup = scopeguard(child);
    assert_eq!(proc_cgroup(child, "0").as_deref(), Some(cg.path.as_str()));
    let row = agent.wait_for_process(child, "container_id", &json!(id));
    assert_attributed(&row, &id, &uid);
    assert_eq!(row["ppid"], json!(std::process::id()), "{row}");
    drop(cleanup);
}

/// Kills and reaps the cloned child when the test ends, passed or not.
fn scopeguard(pid: u32) -> impl Drop {
    struct Reap(u32);
    impl Drop for Reap {
        fn drop(&mut self) {
            // SAFETY: our own child.
            unsafe {
                libc::kill(self.0 as i32, libc::SIGKILL);
                libc::waitpid(self.0 as i32, std::ptr::null_mut(), 0);
            }
        }
    }
    Reap(pid)
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn a_child_cloned_into_a_pod_cgroup_is_in_that_pod() {
    a_child_cloned_into_a_pod_is_in_it("");
}

#[test]
#[ignore = "needs root: loads the eBPF programs and creates pod cgroups"]
fn a_child_cloned_into_a_pod_cgroup_is_in_that_pod_with_the_classic_tracepoints() {
    a_child_cloned_into_a_pod_is_in_it(CLASSIC);
}

/// Where the kernel has BTF the process programs are the BTF tracepoints' (plain loads
/// from the task); `ebpf.btf_tracepoints = false` keeps the classic ones.
#[test]
#[ignore = "needs root: loads the eBPF programs"]
fn the_process_programs_are_the_btf_ones_where_the_kernel_has_btf() {
    let has_btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    let agent = Agent::start("");
    let stats = agent.stats();
    let want = if has_btf { "tp_btf" } else { "tracepoint" };
    assert_eq!(stats["process_programs"], want, "{stats}\n{}", agent.log());
    drop(agent);
    let agent = Agent::start(CLASSIC);
    let stats = agent.stats();
    assert_eq!(stats["process_programs"], "tracepoint", "{stats}");
    assert!(
        agent.log().contains("ebpf.btf_tracepoints = false"),
        "the reason is logged: {}",
        agent.log()
    );
}
