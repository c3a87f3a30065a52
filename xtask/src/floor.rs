//! `cargo xtask bench floor`: what each step of `proc_fork` costs on this kernel and VM.
//!
//! The calibration object (agent-ebpf/src/floor.rs) holds `proc_fork`'s work as cumulative
//! prefixes. Each runs alone on `task_newtask` for one storm, with the kernel's run-time
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

/// The prefixes, in order, with the step each adds to the one before.
const STEPS: [(&str, &str); 6] = [
    ("fork_0", "an empty program (the statistics' own cost)"),
    ("fork_1", "read the record: pid, comm, clone_flags"),
    (
        "fork_2",
        "the parent's tgid, its cgroup id, the boot time (three helpers)",
    ),
    ("fork_3", "look up the parent's entry (its cgroup v1 id)"),
    ("fork_4", "insert the child's entry"),
    (
        "fork_5",
        "notify userspace: ring reserve, fill level, submit",
    ),
];

pub(crate) fn floor(n: u32, rounds: u32, no_write: bool) -> Result<()> {
    require_root()?;
    // As the agent does: tracefs mounted in a mount namespace of our own where the host has
    // none (before any thread starts: unshare needs a single-threaded caller).
    gpu_agent::ebpf::tracefs::prepare_mount_namespace().map_err(anyhow::Error::msg)?;
    let object = ebpf::build()?.with_file_name("floor");
    let bytes = std::fs::read(&object).with_context(|| format!("{}", object.display()))?;
    let _stats = enable_stats(Stats::RunTime).context("enabling program statistics")?;
    let capacity = gpu_agent::config::EbpfConfig::default().capacity();
    // A whole storm's notifications fit even if the drain falls behind.
    let ring_bytes = (n as usize * 80 + (64 << 10)).next_power_of_two() as u32;
    let mut bpf = EbpfLoader::new()
        .map_max_entries("PROCS", capacity)
        .map_max_entries("EVENTS", ring_bytes)
        .load(&bytes)
        .context("loading the calibration object")?;
    for (name, _) in STEPS.iter().chain([&("exit_remove", "")]) {
        let tp: &mut TracePoint = bpf.program_mut(name).context(*name)?.try_into()?;
        tp.load().with_context(|| format!("loading {name}"))?;
    }
    // The agent's consumer polls; so does this one, often enough that the ring never
    // reaches the wake-up threshold (which would add a wake-up to step 5).
    let ring = RingBuf::try_from(bpf.take_map("EVENTS").context("EVENTS")?)?;
    let stop = Arc::new(AtomicBool::new(false));
    let drain = std::thread::spawn({
        let stop = stop.clone();
        move || drain_until(ring, &stop)
    });
    let exit: &mut TracePoint = bpf.program_mut("exit_remove").unwrap().try_into()?;
    exit.attach("sched", "sched_process_exit")?;

    let path = systemd_container(&random_uid(), &random_hex(64));
    let cg = TestCgroup::v2(&path);
    eprintln!("bench floor: {n} fork+exec in {path} per prefix, {rounds} rounds");
    run_storm(&cg, n / 10)?; // warm the page cache
    let mut ns: Vec<Vec<f64>> = vec![vec![]; STEPS.len()];
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..STEPS.len()).collect()
        } else {
            (0..STEPS.len()).rev().collect()
        };
        for i in order {
            let tp: &mut TracePoint = bpf.program_mut(STEPS[i].0).unwrap().try_into()?;
            let before = tp.info()?;
            let link = tp.attach("task", "task_newtask")?;
            run_storm(&cg, n)?;
            tp.detach(link)?;
            let after = tp.info()?;
            let runs = after.run_count() - before.run_count();
            if runs < n as u64 {
                bail!("{} ran {runs} times for {n} forks", STEPS[i].0);
            }
            let per_run = (after.run_time() - before.run_time()).as_nanos() as f64 / runs as f64;
            eprintln!(
                "round {round}: {} {per_run:.0} ns ({runs} runs)",
                STEPS[i].0
            );
            ns[i].push(per_run);
        }
    }
    stop.store(true, Ordering::Relaxed);
    drain.join().expect("drain thread");

    let medians: Vec<f64> = ns.iter_mut().map(|v| median(v)).collect();
    let (md, result) = report(n, rounds, &medians);
    println!("{md}");
    println!("{result}");
    if !no_write {
        write_section("floor", &md)?;
    }
    Ok(())
}

fn drain_until(mut ring: RingBuf<aya::maps::MapData>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        while ring.next().is_some() {}
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn report(n: u32, rounds: u32, medians: &[f64]) -> (String, String) {
    let mut md = format!(
        "Measured by `cargo xtask bench floor` ({n} fork+exec of /bin/true per prefix from a \
         shell in a pod cgroup; {rounds} rounds, order alternated, medians) on {}.\n\n",
        machine()
    );
    md.push_str("| `proc_fork` up to this step | ns per run | the step alone |\n");
    md.push_str("| --- | --- | --- |\n");
    for (i, ((_, step), ns)) in STEPS.iter().zip(medians).enumerate() {
        let alone = if i == 0 {
            String::new()
        } else {
            format!("{:.0}", ns - medians[i - 1])
        };
        md.push_str(&format!("| {step} | {ns:.0} | {alone} |\n"));
    }
    let result = format!(
        "RESULT floor_empty_ns={:.0} floor_fork_ns={:.0} floor_insert_ns={:.0} floor_notify_ns={:.0}",
        medians[0],
        medians[5],
        medians[4] - medians[3],
        medians[5] - medians[4]
    );
    (md, result)
}
