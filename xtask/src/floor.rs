//! `cargo xtask bench floor`: what each step of the fork, exec and exit programs costs on
//! this kernel and VM.
//!
//! The calibration object (agent-ebpf/src/floor.rs) holds their work as cumulative
//! prefixes. Each runs alone on its tracepoint for one storm, with the kernel's run-time
//! statistics on; the rounds alternate the order, and the medians are reported. The
//! difference between two neighbours is one step's cost, cold caches and all.
use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use agent_common::IterConfig;
use anyhow::{bail, Context, Result};
use aya::{
    maps::RingBuf,
    programs::{
        tp_btf::BtfTracePointLinkId, trace_point::TracePointLinkId, BtfTracePoint, TracePoint,
    },
    sys::{enable_stats, Stats},
    Btf, EbpfLoader,
};
use gpu_agent::{config::CgroupConfig, process::cgroup::Hierarchies};
use tests::{
    cgroups::{systemd_container, TestCgroup},
    random_hex, random_uid,
};

use crate::{
    benchkit::host::{machine, median, require_root, run_storm, write_section},
    ebpf,
};

/// One program's prefixes, in order, each with the step it adds to the one before.
struct Family {
    program: &'static str,
    /// (category, event) of a classic tracepoint; ("", function) of a BTF one.
    tracepoint: (&'static str, &'static str),
    prefixes: &'static [(&'static str, &'static str)],
    /// The whole program again with its last step done another way, each measured against
    /// the prefix before that step.
    alternatives: &'static [(&'static str, &'static str)],
}

impl Family {
    fn btf(&self) -> bool {
        self.tracepoint.0.is_empty()
    }

    /// Every program of the family: the prefixes, then the alternatives.
    fn programs(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.prefixes.iter().chain(self.alternatives).map(|p| p.0)
    }

    /// The whole program, as the agent runs it.
    fn whole(&self) -> &'static str {
        self.prefixes[self.prefixes.len() - 1].0
    }
}

/// The classic tracepoint programs, which run where the kernel has no BTF.
const CLASSIC: [Family; 3] = [
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
        alternatives: &[],
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
        alternatives: &[],
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
        alternatives: &[],
    },
];

/// The BTF tracepoint programs, the agent's where the kernel has BTF: plain loads from the
/// task, no helper but the ring's.
const BTF: [Family; 3] = [
    Family {
        program: "proc_fork_btf",
        tracepoint: ("", "task_newtask"),
        prefixes: &[
            ("fork_btf_0", "an empty program (the statistics' own cost)"),
            (
                "fork_btf_1",
                "the clone flags; the child's tgid, start time and parent's tgid",
            ),
            (
                "fork_btf_2",
                "its cgroups (v2 and the tracked v1) and its name",
            ),
            ("fork_btf_3", "store the child's entry (its slot)"),
            (
                "fork_btf_4",
                "notify userspace: ring reserve, fill level, submit",
            ),
        ],
        alternatives: &[(
            "fork_btf_out",
            "notify with one helper instead (fill level, ringbuf_output)",
        )],
    },
    Family {
        program: "proc_exec_btf",
        tracepoint: ("", "sched_process_exec"),
        prefixes: &[
            ("exec_btf_0", "an empty program"),
            ("exec_btf_1", "the tgid, its cgroup2 id, the new name"),
            ("exec_btf_2", "update the entry in place"),
            ("exec_btf_3", "notify userspace"),
        ],
        alternatives: &[("exec_btf_out", "notify with one helper instead")],
    },
    Family {
        program: "proc_exit_btf",
        tracepoint: ("", "sched_process_exit"),
        prefixes: &[
            ("exit_btf_0", "an empty program"),
            (
                "exit_btf_1",
                "whether the group is dead (signal->live), the tgid",
            ),
            ("exit_btf_2", "free the entry (its slot)"),
            ("exit_btf_3", "notify userspace"),
        ],
        alternatives: &[
            ("exit_btf_out", "notify with one helper instead"),
            (
                "exit_btf_batch",
                "notify in batches instead: tgid and start time kept per CPU, a record of 7",
            ),
        ],
    },
];

/// On exit, beside every prefix (after it): keeps the map at the storm's few live processes
/// where no exit prefix removes them yet, as the agent's exit program does.
fn remover(btf: bool) -> (&'static str, (&'static str, &'static str)) {
    match btf {
        true => ("exit_btf_remove", ("", "sched_process_exit")),
        false => ("exit_remove", ("sched", "sched_process_exit")),
    }
}

/// Beside every prefix, attached after it, as the agent's: the other two programs whole,
/// which warm what they share with it (the ring, the map), and the remover. None is
/// measured.
fn background(
    families: &[Family],
    measured: &Family,
) -> Vec<(&'static str, (&'static str, &'static str))> {
    families
        .iter()
        .filter(|f| f.program != measured.program)
        .map(|f| (f.whole(), f.tracepoint))
        .chain([remover(measured.btf())])
        .collect()
}

pub(crate) fn floor(n: u32, rounds: u32, classic: bool, no_write: bool) -> Result<()> {
    require_root()?;
    // As the agent does: tracefs mounted in a mount namespace of our own where the host has
    // none (before any thread starts: unshare needs a single-threaded caller).
    gpu_agent::ebpf::tracefs::prepare_mount_namespace().map_err(anyhow::Error::msg)?;
    let families: &[Family] = if classic {
        check_layouts()?;
        &CLASSIC
    } else {
        &BTF
    };
    // A machine without the toolchain (a GPU machine of the validation) is given the
    // object built elsewhere.
    let object = match std::env::var_os("GPU_AGENT_FLOOR_OBJECT") {
        Some(path) => std::path::PathBuf::from(path),
        None => ebpf::build()?.with_file_name("floor"),
    };
    let bytes = std::fs::read(&object).with_context(|| format!("{}", object.display()))?;
    let _stats = enable_stats(Stats::RunTime).context("enabling program statistics")?;
    let mut bpf = load(&bytes, n, classic)?;
    let btf = (!classic).then(Btf::from_sys_fs).transpose()?;
    let programs = families
        .iter()
        .flat_map(|f| f.programs().map(|p| (p, f.tracepoint)));
    for (name, tp) in programs.chain([remover(!classic)]) {
        load_program(&mut bpf, name, tp.1, btf.as_ref())?;
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
                             // (family, position in it, program)
    let runs: Vec<(usize, usize, &str)> = families
        .iter()
        .enumerate()
        .flat_map(|(f, fam)| fam.programs().enumerate().map(move |(p, n)| (f, p, n)))
        .collect();
    let mut ns: Vec<Vec<Vec<f64>>> = families
        .iter()
        .map(|f| vec![vec![]; f.programs().count()])
        .collect();
    for round in 0..rounds {
        let mut order = runs.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for (f, p, name) in order {
            let per_run = measure(&mut bpf, &cg, n, families, f, name)?;
            eprintln!("round {round}: {name} {per_run:.0} ns");
            ns[f][p].push(per_run);
        }
    }
    stop.store(true, Ordering::Relaxed);
    drain.join().expect("drain thread");

    let medians: Vec<Vec<f64>> = ns
        .iter_mut()
        .map(|f| f.iter_mut().map(|v| median(v)).collect())
        .collect();
    let (md, result) = report(families, n, rounds, &medians);
    println!("{md}");
    println!("{result}");
    if !no_write {
        write_section(if classic { "floor" } else { "floor-btf" }, &md)?;
    }
    Ok(())
}

/// The calibration object, its maps sized as the agent sizes its own, and for the BTF
/// programs this kernel's offsets, as the agent's loader finds them.
fn load(bytes: &[u8], n: u32, classic: bool) -> Result<aya::Ebpf> {
    let ecfg = gpu_agent::config::EbpfConfig::default();
    let (capacity, slots) = (ecfg.capacity(), ecfg.slots());
    // A whole storm's notifications fit even if the drain falls behind.
    let ring_bytes = (n as usize * 80 + (64 << 10)).next_power_of_two() as u32;
    let offsets = match classic {
        true => IterConfig::zeroed(),
        false => {
            let h = Hierarchies::detect(Path::new("/proc"), &CgroupConfig::default().v1_hierarchy);
            let v1 = h.v1.as_ref().map(|h| (h.id, h.name.as_str()));
            gpu_agent::ebpf::kernel_offsets(v1).map_err(anyhow::Error::msg)?
        }
    };
    EbpfLoader::new()
        .map_max_entries("PROCS", capacity)
        .map_max_entries("SLOTS", slots)
        .override_global("FLOOR_SLOTS_MASK", &(slots - 1), true)
        .override_global("ITER_CONFIG", &offsets, true)
        .map_max_entries("EVENTS", ring_bytes)
        .load(bytes)
        .context("loading the calibration object")
}

/// Loads a program: a BTF one (with `btf`) for the kernel function `event`.
fn load_program(bpf: &mut aya::Ebpf, name: &str, event: &str, btf: Option<&Btf>) -> Result<()> {
    let prog = bpf.program_mut(name).context(name.to_string())?;
    match btf {
        Some(btf) => {
            let tp: &mut BtfTracePoint = prog.try_into()?;
            tp.load(event, btf)
        }
        None => {
            let tp: &mut TracePoint = prog.try_into()?;
            tp.load()
        }
    }
    .with_context(|| format!("loading {name}"))
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

/// An attached program, classic or BTF.
enum Attached {
    Tp(&'static str, TracePointLinkId),
    Btf(&'static str, BtfTracePointLinkId),
}

fn attach(bpf: &mut aya::Ebpf, name: &'static str, tp: (&str, &str)) -> Result<Attached> {
    let prog = bpf.program_mut(name).unwrap();
    Ok(match tp {
        ("", _) => {
            let p: &mut BtfTracePoint = prog.try_into()?;
            Attached::Btf(name, p.attach()?)
        }
        (category, event) => {
            let p: &mut TracePoint = prog.try_into()?;
            Attached::Tp(name, p.attach(category, event)?)
        }
    })
}

fn detach(bpf: &mut aya::Ebpf, link: Attached) -> Result<()> {
    match link {
        Attached::Tp(name, link) => {
            let p: &mut TracePoint = bpf.program_mut(name).unwrap().try_into()?;
            p.detach(link)?;
        }
        Attached::Btf(name, link) => {
            let p: &mut BtfTracePoint = bpf.program_mut(name).unwrap().try_into()?;
            p.detach(link)?;
        }
    }
    Ok(())
}

/// (run count, run time) of a program so far.
fn stats(bpf: &aya::Ebpf, name: &str) -> Result<(u64, Duration)> {
    let info = bpf.program(name).unwrap().info()?;
    Ok((info.run_count(), info.run_time()))
}

/// One storm with program `name` of family `f` attached alone (with the background after
/// it): its kernel run time per run, ns.
fn measure(
    bpf: &mut aya::Ebpf,
    cg: &TestCgroup,
    n: u32,
    families: &[Family],
    f: usize,
    name: &'static str,
) -> Result<f64> {
    let fam = &families[f];
    let before = stats(bpf, name)?;
    let mut links = vec![attach(bpf, name, fam.tracepoint)?];
    for (prog, tp) in background(families, fam) {
        links.push(attach(bpf, prog, tp)?);
    }
    let storm = run_storm(cg, n);
    for link in links.into_iter().rev() {
        detach(bpf, link)?;
    }
    storm?;
    let after = stats(bpf, name)?;
    let runs = after.0 - before.0;
    if runs < n as u64 {
        bail!("{name} ran {runs} times in a storm of {n} fork+exec");
    }
    Ok((after.1 - before.1).as_nanos() as f64 / runs as f64)
}

fn drain_until(mut ring: RingBuf<aya::maps::MapData>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        while ring.next().is_some() {}
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn report(families: &[Family], n: u32, rounds: u32, medians: &[Vec<f64>]) -> (String, String) {
    let mut md = format!(
        "Measured by `cargo xtask bench floor{}` ({n} fork+exec of /bin/true per prefix from a \
         shell in a pod cgroup; {rounds} rounds, order alternated, medians) on {}.\n\n",
        if families[0].btf() { "" } else { " --classic" },
        machine()
    );
    md.push_str("| program | up to this step | ns per run | the step alone |\n");
    md.push_str("| --- | --- | --- | --- |\n");
    for (fam, ns) in families.iter().zip(medians) {
        let last = fam.prefixes.len() - 1;
        for (i, v) in ns.iter().enumerate() {
            // An alternative (after the prefixes) replaces the last step.
            let (step, base) = match fam.prefixes.get(i) {
                Some((_, step)) => (*step, i.checked_sub(1)),
                None => (fam.alternatives[i - last - 1].1, Some(last - 1)),
            };
            let alone = base.map_or(String::new(), |b| format!("{:.0}", v - ns[b]));
            md.push_str(&format!(
                "| {} | {step} | {v:.0} | {alone} |\n",
                fam.program
            ));
        }
    }
    let whole: Vec<f64> = families
        .iter()
        .zip(medians)
        .map(|(f, ns)| ns[f.prefixes.len() - 1])
        .collect();
    let fork = &medians[0];
    let last = families[0].prefixes.len() - 1;
    let mut result = format!(
        "RESULT floor_empty_ns={:.0} floor_fork_ns={:.0} floor_exec_ns={:.0} floor_exit_ns={:.0} \
         floor_mean_ns={:.0} floor_insert_ns={:.0} floor_notify_ns={:.0}",
        fork[0],
        whole[0],
        whole[1],
        whole[2],
        whole.iter().sum::<f64>() / whole.len() as f64,
        fork[last - 1] - fork[last - 2],
        fork[last] - fork[last - 1],
    );
    // The first alternative of each family: the one-helper notification.
    if !families[0].alternatives.is_empty() {
        let alt = families
            .iter()
            .zip(medians)
            .map(|(f, ns)| ns[f.prefixes.len()]);
        result.push_str(&format!(
            " floor_output_mean_ns={:.0}",
            alt.sum::<f64>() / families.len() as f64
        ));
    }
    (md, result)
}
