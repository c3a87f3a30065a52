//! Calibration programs for `cargo xtask bench floor`; never loaded by the agent.
//!
//! The work of `proc_fork`, `proc_exec` and `proc_exit`, cut into cumulative prefixes:
//! `fork_N` does steps 1..=N of fork, with the same types, helpers and map kinds, on maps of
//! its own. Each prefix runs alone on its tracepoint during a storm, so the differences
//! between neighbours are what each step costs where it really runs: after the kernel's
//! fork, exec or exit path has evicted the caches. Running them side by side on one event
//! would let the first pay for the others' cold misses.
#![no_std]
#![no_main]

use agent_common::{
    ExitEvent, IterConfig, NewTaskRecord, ProcEvent, ProcInfo, Slot, EVENT_EXEC, EVENT_EXIT,
    EVENT_FORK, EXIT_GROUP_DEAD_USUAL,
};
use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_ktime_get_boot_ns,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};

mod shared;
use shared::{field, field_ptr, task_cgroups, task_comm};

const CLONE_THREAD: u64 = 0x0001_0000;
/// The agent's default `ebpf.wakeup_bytes`.
const WAKEUP_BYTES: u32 = 256 << 10;

// Sized by the bench: PROCS and SLOTS as the agent sizes its own, EVENTS to hold a whole
// storm.
#[map]
static PROCS: HashMap<u32, ProcInfo> = HashMap::with_max_entries(65536, 0);
#[map]
static SLOTS: Array<Slot> = Array::with_max_entries(65536, 0);
/// `Config::slots_mask` as the agent would set it; set by the bench.
#[no_mangle]
static FLOOR_SLOTS_MASK: u32 = 0;

#[inline(always)]
fn procs() -> shared::Procs<'static> {
    shared::Procs {
        hash: &PROCS,
        slots: &SLOTS,
        mask: unsafe { core::ptr::read_volatile(core::ptr::addr_of!(FLOOR_SLOTS_MASK)) },
    }
}
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);
/// Exits waiting to be notified, per CPU (`exit_btf_batch`): a record of `BATCH` goes out
/// once they are all there.
const BATCH: usize = 7;
#[repr(C)]
#[derive(Clone, Copy)]
struct ExitBatch {
    count: u64,
    /// (start time, tgid): the start time makes a late exit unable to remove a reused
    /// tgid's new process.
    exits: [(u64, u64); BATCH],
}
#[map]
static EXIT_BATCH: PerCpuArray<ExitBatch> = PerCpuArray::with_max_entries(1, 0);

/// This kernel's offsets, as the agent's loader sets its own; set by the bench.
#[no_mangle]
static ITER_CONFIG: IterConfig = IterConfig::zeroed();

macro_rules! icfg {
    ($field:ident) => {{
        #[allow(unused_unsafe)]
        let v = unsafe { core::ptr::read_volatile(core::ptr::addr_of!(ITER_CONFIG.$field)) };
        v as u64
    }};
}

/// Steps 1..=N of `proc_fork` (agent-ebpf/src/main.rs), in its order.
#[inline(always)]
fn fork_steps<const N: u32>(ctx: &TracePointContext) -> u32 {
    // 1: the record's pid, comm and clone_flags (plain loads); threads stop here.
    let r = unsafe { NewTaskRecord::load(ctx.as_ptr() as *const u8) };
    if r.clone_flags & CLONE_THREAD != 0 || N < 2 {
        return 0;
    }
    // 2: the parent, its cgroup and the time.
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    let mut info = ProcInfo::new(
        Some(unsafe { bpf_get_current_cgroup_id() }),
        None,
        Some(unsafe { bpf_ktime_get_boot_ns() }),
        parent,
    );
    info.comm = r.comm;
    if N < 3 {
        // Keeps the step's work from being optimised away.
        return (info.start_ns == 1) as u32;
    }
    // 3: the parent's entry (its cgroup v1 id, where a v1 hierarchy is tracked).
    let procs = procs();
    if let Some(p) = procs.find(parent) {
        let p = unsafe { *p };
        if p.v1_known() {
            info.set_v1(p.cgroup_v1_id);
        }
    }
    if N < 4 {
        return (info.cgroup_v1_id == 1) as u32;
    }
    // 4: the child's entry.
    let _ = procs.insert(r.pid as u32, &info, true);
    if N < 5 {
        return 0;
    }
    // 5: the notification.
    shared::notify_proc(&EVENTS, WAKEUP_BYTES, EVENT_FORK, r.pid as u32, &info);
    0
}

/// Steps 1..=N of `proc_exec`.
#[inline(always)]
fn exec_steps<const N: u32>() -> u32 {
    // 1: the process, its cgroup and its new name.
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let comm = bpf_get_current_comm().unwrap_or([0; 16]);
    if N < 2 {
        return (cgroup_id == 1 && comm[3] == 9) as u32;
    }
    // 2: its entry, updated in place (inserted when fork's was missing).
    let (info, _) = shared::exec_entry(&procs(), tgid, cgroup_id, comm);
    if N < 3 {
        return 0;
    }
    // 3: the notification.
    shared::notify_proc(&EVENTS, WAKEUP_BYTES, EVENT_EXEC, tgid, &info);
    0
}

/// Steps 1..=N of `proc_exit`.
#[inline(always)]
fn exit_steps<const N: u32>(ctx: &TracePointContext) -> u32 {
    // 1: the thread, and whether its group is dead (the record's `group_dead`, as the
    // agent loads it on 6.x kernels); threads that leave a live group stop here.
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let dead = unsafe { *(ctx.as_ptr() as *const u8).add(EXIT_GROUP_DEAD_USUAL as usize) };
    if dead == 0 || N < 2 {
        return 0;
    }
    // 2: the entry removed.
    procs().remove(tgid);
    if N < 3 {
        return 0;
    }
    // 3: the notification (the 8-byte exit record).
    shared::notify_exit(&EVENTS, WAKEUP_BYTES, tgid);
    0
}

/// Every field of an entry folded into one value, so that a prefix that stops before using
/// the entry still makes each of its loads.
#[inline(always)]
fn fold(info: &ProcInfo) -> u64 {
    let name = u64::from_ne_bytes(info.comm[..8].try_into().unwrap());
    let hi = u64::from_ne_bytes(info.comm[8..].try_into().unwrap());
    info.cgroup_id ^ info.cgroup_v1_id ^ info.start_ns ^ info.ppid as u64 ^ name ^ hi
}

/// The notification of a fork or exec: reserve and submit as the agent, or with one helper
/// (`OUTPUT`).
#[inline(always)]
fn notify_proc<const OUTPUT: bool>(kind: u32, tgid: u32, info: &ProcInfo) {
    if OUTPUT {
        let info = *info;
        shared::output(&EVENTS, WAKEUP_BYTES, &ProcEvent { kind, tgid, info });
    } else {
        shared::notify_proc(&EVENTS, WAKEUP_BYTES, kind, tgid, info);
    }
}

/// The tgid of an exiting task whose group is dead (`signal->live` is 0), as the agent's
/// exit program decides; None for a thread that leaves a live group.
#[inline(always)]
unsafe fn dead_group(task: *const u8) -> Option<u32> {
    let signal = field_ptr(task, icfg!(task_signal));
    if field::<i32>(signal, icfg!(signal_live)) != 0 {
        return None;
    }
    Some(field::<i32>(task, icfg!(task_tgid)) as u32)
}

/// Steps 1..=N of `proc_fork_btf`; `OUTPUT`: step 4 notifies with one helper
/// (`bpf_ringbuf_output`). The parent's entry is not read: the agent reads it only where
/// the tracked v1 hierarchy has no controller.
#[inline(always)]
fn fork_btf_steps<const N: u32, const OUTPUT: bool>(ctx: &BtfTracePointContext) -> u32 {
    // 1: the clone flags (threads stop here), the child's tgid, start time and parent.
    let task: *const u8 = ctx.arg(0);
    let clone_flags: u64 = ctx.arg(1);
    if clone_flags & CLONE_THREAD != 0 {
        return 0;
    }
    unsafe {
        let tgid = field::<i32>(task, icfg!(task_tgid)) as u32;
        let start: u64 = field(task, icfg!(task_start));
        let parent = field_ptr(task, icfg!(task_parent));
        let ppid = field::<i32>(parent, icfg!(task_tgid)) as u32;
        if N < 2 {
            // Every value kept: a prefix must not leave out a load the next one needs.
            return (start ^ (tgid ^ ppid) as u64 == 1) as u32;
        }
        // 2: its cgroups (v2 and the tracked v1) and name.
        let (v2, v1) = task_cgroups(&ITER_CONFIG, task);
        let mut info = ProcInfo::new(Some(v2), v1, Some(start), ppid);
        info.comm = task_comm(&ITER_CONFIG, task);
        if N < 3 {
            return (fold(&info) ^ tgid as u64 == 1) as u32;
        }
        // 3: its entry.
        let procs = procs();
        let _ = procs.insert(tgid, &info, true);
        if N < 4 {
            return 0;
        }
        // 4: the notification.
        notify_proc::<OUTPUT>(EVENT_FORK, tgid, &info);
    }
    0
}

/// Steps 1..=N of `proc_exec_btf`; `OUTPUT` as for fork.
#[inline(always)]
fn exec_btf_steps<const N: u32, const OUTPUT: bool>(ctx: &BtfTracePointContext) -> u32 {
    // 1: the process, its cgroup2 id and its new name.
    let task: *const u8 = ctx.arg(0);
    unsafe {
        let tgid = field::<i32>(task, icfg!(task_tgid)) as u32;
        let (v2, _) = task_cgroups(&ITER_CONFIG, task);
        let comm = task_comm(&ITER_CONFIG, task);
        if N < 2 {
            let name = u64::from_ne_bytes(comm[..8].try_into().unwrap());
            return (v2 ^ name ^ tgid as u64 == 1) as u32;
        }
        // 2: its entry, updated in place.
        let (info, _) = shared::exec_entry(&procs(), tgid, v2, comm);
        if N < 3 {
            return 0;
        }
        // 3: the notification.
        notify_proc::<OUTPUT>(EVENT_EXEC, tgid, &info);
    }
    0
}

/// Steps 1..=N of `proc_exit_btf`; `OUTPUT` as for fork.
#[inline(always)]
fn exit_btf_steps<const N: u32, const OUTPUT: bool>(ctx: &BtfTracePointContext) -> u32 {
    // 1: whether the group is dead (`signal->live`), and its tgid.
    let task: *const u8 = ctx.arg(0);
    unsafe {
        let Some(tgid) = dead_group(task) else {
            return 0;
        };
        if N < 2 {
            return (tgid == 1) as u32;
        }
        // 2: the entry removed.
        procs().remove(tgid);
        if N < 3 {
            return 0;
        }
        // 3: the notification.
        if OUTPUT {
            let kind = EVENT_EXIT;
            shared::output(&EVENTS, WAKEUP_BYTES, &ExitEvent { kind, tgid });
        } else {
            shared::notify_exit(&EVENTS, WAKEUP_BYTES, tgid);
        }
    }
    0
}

/// `proc_exit_btf` with its exits notified in batches: each kept in a per-CPU record (hot
/// in this CPU's cache), the record sent to the ring when it holds `BATCH`. What the exit's
/// notification would cost if userspace took exits late (it would also have to read the
/// records that wait, on its timer).
#[inline(always)]
fn exit_btf_batched(ctx: &BtfTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    unsafe {
        let Some(tgid) = dead_group(task) else {
            return 0;
        };
        let start: u64 = field(task, icfg!(task_start));
        procs().remove(tgid);
        let Some(b) = EXIT_BATCH.get_ptr_mut(0) else {
            return 0;
        };
        let n = (*b).count as usize;
        if n >= BATCH {
            (*b).count = 0;
            return 0;
        }
        (*b).exits[n] = (start, tgid as u64);
        if n + 1 < BATCH {
            (*b).count = n as u64 + 1;
            return 0;
        }
        (*b).count = 0;
        if let Some(mut entry) = EVENTS.reserve::<ExitBatch>(0) {
            entry.write(*b);
            entry.submit(shared::wakeup_flags(&EVENTS, WAKEUP_BYTES));
        }
    }
    0
}

/// One BTF program per prefix, as `prefixes`.
macro_rules! btf_prefixes {
    ($($name:ident($ctx:ident) on $function:literal => $body:expr;)*) => {
        $(
            #[btf_tracepoint(function = $function)]
            pub fn $name($ctx: BtfTracePointContext) -> u32 {
                $body
            }
        )*
    };
}

btf_prefixes! {
    fork_btf_0(_ctx) on "task_newtask" => 0;
    fork_btf_1(ctx) on "task_newtask" => fork_btf_steps::<1, false>(&ctx);
    fork_btf_2(ctx) on "task_newtask" => fork_btf_steps::<2, false>(&ctx);
    fork_btf_3(ctx) on "task_newtask" => fork_btf_steps::<3, false>(&ctx);
    fork_btf_4(ctx) on "task_newtask" => fork_btf_steps::<4, false>(&ctx);
    fork_btf_out(ctx) on "task_newtask" => fork_btf_steps::<4, true>(&ctx);
    exec_btf_0(_ctx) on "sched_process_exec" => 0;
    exec_btf_1(ctx) on "sched_process_exec" => exec_btf_steps::<1, false>(&ctx);
    exec_btf_2(ctx) on "sched_process_exec" => exec_btf_steps::<2, false>(&ctx);
    exec_btf_3(ctx) on "sched_process_exec" => exec_btf_steps::<3, false>(&ctx);
    exec_btf_out(ctx) on "sched_process_exec" => exec_btf_steps::<3, true>(&ctx);
    exit_btf_0(_ctx) on "sched_process_exit" => 0;
    exit_btf_1(ctx) on "sched_process_exit" => exit_btf_steps::<1, false>(&ctx);
    exit_btf_2(ctx) on "sched_process_exit" => exit_btf_steps::<2, false>(&ctx);
    exit_btf_3(ctx) on "sched_process_exit" => exit_btf_steps::<3, false>(&ctx);
    exit_btf_out(ctx) on "sched_process_exit" => exit_btf_steps::<3, true>(&ctx);
    exit_btf_batch(ctx) on "sched_process_exit" => exit_btf_batched(&ctx);
}

/// One program per prefix: each must be its own symbol for the bench to attach it.
macro_rules! prefixes {
    ($($name:ident($ctx:ident) => $body:expr;)*) => {
        $(
            #[tracepoint]
            pub fn $name($ctx: TracePointContext) -> u32 {
                $body
            }
        )*
    };
}

prefixes! {
    fork_0(_ctx) => 0;
    fork_1(ctx) => fork_steps::<1>(&ctx);
    fork_2(ctx) => fork_steps::<2>(&ctx);
    fork_3(ctx) => fork_steps::<3>(&ctx);
    fork_4(ctx) => fork_steps::<4>(&ctx);
    fork_5(ctx) => fork_steps::<5>(&ctx);
    exec_0(_ctx) => 0;
    exec_1(_ctx) => exec_steps::<1>();
    exec_2(_ctx) => exec_steps::<2>();
    exec_3(_ctx) => exec_steps::<3>();
    exit_0(_ctx) => 0;
    exit_1(ctx) => exit_steps::<1>(&ctx);
    exit_2(ctx) => exit_steps::<2>(&ctx);
    exit_3(ctx) => exit_steps::<3>(&ctx);
}

/// On `sched_process_exit`, beside every prefix (after it): the map stays at the storm's
/// few live processes where no exit prefix removes them yet, and freed elements are
/// reused, as in the agent.
#[tracepoint]
pub fn exit_remove(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if pid_tgid as u32 == tgid {
        procs().remove(tgid);
    }
    0
}

/// `exit_remove` for the BTF families, as the agent's BTF exit program decides.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn exit_btf_remove(ctx: BtfTracePointContext) -> u32 {
    exit_btf_steps::<2, false>(&ctx)
}
