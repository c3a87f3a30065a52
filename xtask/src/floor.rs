//! `cargo xtask bench floor`: what each step of the fork, exec and exit programs costs on
//! this kernel and VM.
//!
//! The calibration object (agent-ebpf/src/floor.rs) holds their work as cumulative
//! prefixes. Each runs alone on its tracepoint for one storm, with the kernel's run-time
//! statistics on; the rounds alternate the order, and the medians are reported. The
//! difference between two neighbours is one step's cost, cold caches and all.
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{bail, Context, Result};
use aya::{
    maps::RingBuf,
    programs::TracePoint,
    sys::{enable_stats, Stats},
    EbpfLoader,
};
use tests::{
    cgroups::{systemd_container, TestCgroup},
    random_hex, random_uid,
};

use crate::{
    bench::{machine, median, require_root, run_storm, write_section},
    ebpf,
};

/// One program's prefixes, in order, each with the step it adds to the one before.
struct Family {
    program: &'static str,
    tracepoint: (&'static str, &'static str),
    prefixes: &'static [(&'static str, &'static str)],
}

const FAMILIES: [Family; 3] = [
    Family {
        program: "proc_fork",
        tracepoint: ("task", "task_newtask"),
        prefixes: &[
            ("fork_0", "an empty program (the statistics' own cost)"),
            ("fork_1", "read the record: pid, comm, clone_flags"),
            (
                "fork_2",
                "the parent's tgid, its cgroup id, the boot time (three helpers)",
            ),
            ("fork_3", "look up the parent's entry (its cgroup v1 id)"),
            ("fork_4", "store the child's entry (its slot)"),
            (
                "fork_5",
                "notify userspace: ring reserve, fill level, submit",
            ),
        ],
    },
    Family {
        program: "proc_exec",
        tracepoint: ("sched", "sched_process_exec"),
        prefixes: &[
            ("exec_0", "an empty program"),
            (
                "exec_1",
                "the tgid, the cgroup id, the new comm (three helpers)",
            ),
            ("exec_2", "update the entry in place"),
            ("exec_3", "notify userspace"),
        ],
    },
    Family {
        program: "proc_exit",
        tracepoint: ("sched", "sched_process_exit"),
        prefixes: &[
            ("exit_0", "an empty program"),
            ("exit_1", "the tgid and the record's group_dead"),
            ("exit_2", "free the entry (its slot)"),
            ("exit_3", "notify userspace"),
        ],
    },
];

/// Beside every prefix, attached after it, as the agent's: the other two programs whole,
/// which warm what they share with it (the ring, the map), and `exit_remove`, which keeps an
/// entry per live process where no prefix on exit removes them yet. None is measured.
fn background(measured: &Family) -> Vec<(&'static str, (&'static str, &'static str))> {
    FAMILIES
        .iter()
        .filter(|f| f.program != measured.program)
        .map(|f| (f.prefixes[f.prefixes.len() - 1].0, f.tracepoint))
        .chain([("exit_remove", ("sched", "sched_process_exit"))])
        .collect()
}

pub(crate) fn floor(n: u32, rounds: u32, no_write: bool) -> Result<()> {
    require_root()?;
    // As the agent does: tracefs mounted in a mount namespace of our own where the host has
    // none (before any thread starts: unshare needs a single-threaded caller).
    gpu_agent::ebpf::tracefs::prepare_mount_namespace().map_err(anyhow::Error::msg)?;
    check_layouts()?;
    // A machine without the toolchain (a GPU machine of the validation) is given the
    // object built elsewhere.
    let object = match std::env::var_os("GPU_AGENT_FLOOR_OBJECT") {
        Some(path) => std::path::PathBuf::from(path),
        None => ebpf::build()?.with_file_name("floor"),
    };
    let bytes = std::fs::read(&object).with_context(|| format!("{}", object.display()))?;
    let _stats = enable_stats(Stats::RunTime).context("enabling program statistics")?;
    let ecfg = gpu_agent::config::EbpfConfig::default();
    let (capacity, slots) = (ecfg.capacity(), ecfg.slots());
    // A whole storm's notifications fit even if the drain falls behind.
    let ring_bytes = (n as usize * 80 + (64 << 10)).next_power_of_two() as u32;
    let mut bpf = EbpfLoader::new()
        .map_max_entries("PROCS", capacity)
        .map_max_entries("SLOTS", slots)
        .override_global("FLOOR_SLOTS_MASK", &(slots - 1), true)
        .map_max_entries("EVENTS", ring_bytes)
        .load(&bytes)
        .context("loading the calibration object")?;
    let names = FAMILIES.iter().flat_map(|f| f.prefixes.iter().map(|p| p.0));
    for name in names.chain(["exit_remove"]) {
        let tp: &mut TracePoint = bpf.program_mut(name).context(name)?.try_into()?;
        tp.load().with_context(|| format!("loading {name}"))?;
    }
    // The agent's consumer polls; so does this one, often enough that the ring never
    // reaches the wake-up threshold (which would add a wake-up to the notifications).
    let ring = RingBuf::try_from(bpf.take_map("EVENTS").context("EVENTS")?)?;
    let stop = Arc::new(AtomicBool::new(false));
    let drain = std::thread::spawn({
        let stop = stop.clone();
        move || drain_until(ring, &stop)
    });

    let path = systemd_container(&random_uid(), &random_hex(64));
    let cg = TestCgroup::v2(&path);
    eprintln!("bench floor: {n} fork+exec in {path} per prefix, {rounds} rounds");
    run_storm(&cg, n / 10)?; // warm the page cache
    let runs: Vec<(usize, usize)> = FAMILIES
        .iter()
        .enumerate()
        .flat_map(|(f, fam)| (0..fam.prefixes.len()).map(move |p| (f, p)))
        .collect();
    let mut ns: Vec<Vec<Vec<f64>>> = FAMILIES
        .iter()
        .map(|f| vec![vec![]; f.prefixes.len()])
        .collect();
    for round in 0..rounds {
        let mut order = runs.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for (f, p) in order {
            let per_run = measure(&mut bpf, &cg, n, &FAMILIES[f], p)?;
            eprintln!(
                "round {round}: {} {per_run:.0} ns",
                FAMILIES[f].prefixes[p].0
            );
            ns[f][p].push(per_run);
        }
    }
    stop.store(true, Ordering::Relaxed);
    drain.join().expect("drain thread");

    let medians: Vec<Vec<f64>> = ns
        .iter_mut()
        .map(|f| f.iter_mut().map(|v| median(v)).collect())
        .collect();
    let (md, result) = report(n, rounds, &medians);
    println!("{md}");
    println!("{result}");
    if !no_write {
        write_section("floor", &md)?;
    }
    Ok(())
}

/// The calibration programs load the records at the usual offsets, as the agent does
/// where the format files agree; elsewhere they would read the wrong bytes.
fn check_layouts() -> Result<()> {
    let tracefs = gpu_agent::ebpf::tracefs::find().context("tracefs not found")?;
    let cfg = gpu_agent::ebpf::tracefs::offsets(&tracefs).map_err(anyhow::Error::msg)?;
    if cfg.newtask_packed == 0 || cfg.exit_group_dead != agent_common::EXIT_GROUP_DEAD_USUAL {
        bail!("this kernel's task_newtask or sched_process_exit layout is not the usual one");
    }
    Ok(())
}

/// One storm with prefix `p` of `fam` attached alone (with the background after it):
/// its kernel run time per run, ns.
fn measure(bpf: &mut aya::Ebpf, cg: &TestCgroup, n: u32, fam: &Family, p: usize) -> Result<f64> {
    let name = fam.prefixes[p].0;
    let (category, event) = fam.tracepoint;
    let tp: &mut TracePoint = bpf.program_mut(name).unwrap().try_into()?;
    let before = tp.info()?;
    let link = tp.attach(category, event)?;
    let mut links = vec![];
    for (prog, (category, event)) in background(fam) {
        let tp: &mut TracePoint = bpf.program_mut(prog).unwrap().try_into()?;
        links.push((prog, tp.attach(category, event)?));
    }
    let storm = run_storm(cg, n);
    for (prog, link) in links {
        let tp: &mut TracePoint = bpf.program_mut(prog).unwrap().try_into()?;
        tp.detach(link)?;
    }
    let tp: &mut TracePoint = bpf.program_mut(name).unwrap().try_into()?;
    tp.detach(link)?;
    storm?;
    let after = tp.info()?;
    let runs = after.run_count() - before.run_count();
    if runs < n as u64 {
        bail!("{name} ran {runs} times in a storm of {n} fork+exec");
    }
    Ok((after.run_time() - before.run_time()).as_nanos() as f64 / runs as f64)
}

fn drain_until(mut ring: RingBuf<aya::maps::MapData>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        while ring.next().is_some() {}
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn report(n: u32, rounds: u32, medians: &[Vec<f64>]) -> (String, String) {
    let mut md = format!(
        "Measured by `cargo xtask bench floor` ({n} fork+exec of /bin/true per prefix from a \
         shell in a pod cgroup; {rounds} rounds, order alternated, medians) on {}.\n\n",
        machine()
    );
    md.push_str("| program | up to this step | ns per run | the step alone |\n");
    md.push_str("| --- | --- | --- | --- |\n");
    for (fam, ns) in FAMILIES.iter().zip(medians) {
        for (i, ((_, step), v)) in fam.prefixes.iter().zip(ns).enumerate() {
            let alone = match i {
                0 => String::new(),
                _ => format!("{:.0}", v - ns[i - 1]),
            };
            md.push_str(&format!(
                "| {} | {step} | {v:.0} | {alone} |\n",
                fam.program
            ));
        }
    }
    let whole: Vec<f64> = medians.iter().map(|ns| ns[ns.len() - 1]).collect();
    let fork = &medians[0];
    let result = format!(
        "RESULT floor_empty_ns={:.0} floor_fork_ns={:.0} floor_exec_ns={:.0} floor_exit_ns={:.0} \
         floor_mean_ns={:.0} floor_insert_ns={:.0} floor_notify_ns={:.0}",
        fork[0],
        whole[0],
        whole[1],
        whole[2],
        whole.iter().sum::<f64>() / whole.len() as f64,
        fork[4] - fork[3],
        fork[5] - fork[4],
    );
    (md, result)
}
