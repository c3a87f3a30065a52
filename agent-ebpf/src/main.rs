//! Process lifecycle and cgroup tracepoints. They keep `PROCS` (tgid -> cgroup, start,
//! parent) true in the kernel and notify userspace through `EVENTS`. They fire on process
//! lifecycle and cgroup events only, never per context switch.
#![no_std]
#![no_main]

use agent_common::{
    CgroupEvent, Config, IterConfig, NewTaskRecord, ProcInfo, Slot, ABSENT, CGROUP_PATH_MAX,
    COUNTERS_LEN, COUNTER_MAP_FULL, COUNTER_READ_ERRORS, COUNTER_RINGBUF_LOST, EVENT_CGROUP_ATTACH,
    EVENT_CGROUP_MKDIR, EVENT_CGROUP_RMDIR, EVENT_EXEC, EVENT_FORK, EXIT_GROUP_DEAD_USUAL,
    F_START_KNOWN,
};
use aya_ebpf::{
    bindings::seq_file,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_ktime_get_boot_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
        generated::bpf_seq_write,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};
use aya_log_ebpf::error;

mod shared;
use shared::{field, field_ptr, task_cgroups, task_comm};

const CLONE_THREAD: u64 = 0x0001_0000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Offsets and tunables, overwritten by the loader (`Config` in agent-common).
#[no_mangle]
static AGENT_CONFIG: Config = Config::zeroed();

// Sizes are defaults; the loader sets them from the agent's config.
#[map]
static PROCS: HashMap<u32, ProcInfo> = HashMap::with_max_entries(65536, 0);
#[map]
static SLOTS: Array<Slot> = Array::with_max_entries(65536, 0);
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS_LEN, 0);

/// Offsets for the start-up task iterator, from BTF (`IterConfig` in agent-common).
#[no_mangle]
static ITER_CONFIG: IterConfig = IterConfig::zeroed();

/// One field of the loader's config. Volatile: the value is patched into .rodata at load
/// time, after compilation. Per field: copying the whole struct cost every event ~20 loads.
macro_rules! cfg {
    ($field:ident) => {{
        // Also used inside the BTF programs' unsafe blocks.
        #[allow(unused_unsafe)]
        let v = unsafe { core::ptr::read_volatile(core::ptr::addr_of!(AGENT_CONFIG.$field)) };
        v
    }};
}

macro_rules! icfg {
    ($field:ident) => {{
        // Also used inside the BTF programs' unsafe blocks.
        #[allow(unused_unsafe)]
        let v = unsafe { core::ptr::read_volatile(core::ptr::addr_of!(ITER_CONFIG.$field)) };
        v as u64
    }};
}

/// `PROCS` and `SLOTS`, as the loader sized them.
#[inline(always)]
fn procs() -> shared::Procs<'static> {
    shared::Procs {
        hash: &PROCS,
        slots: &SLOTS,
        mask: cfg!(slots_mask),
    }
}

#[inline(always)]
fn count(index: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(index) {
        unsafe { *c += 1 };
    }
}

#[inline(always)]
fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// The wake-up rule, with the loader's threshold.
#[inline(always)]
fn submit_flags() -> u64 {
    shared::wakeup_flags(&EVENTS, cfg!(wakeup_bytes))
}

#[inline(always)]
fn notify_proc(kind: u32, tgid: u32, info: &ProcInfo) {
    // When the ring is full the map is already right; userspace resyncs from it when it
    // sees the drop.
    if !shared::notify_proc(&EVENTS, cfg!(wakeup_bytes), kind, tgid, info) {
        count(COUNTER_RINGBUF_LOST);
    }
}

/// What both fork programs end with: the child's entry stored (a stale entry under a
/// reused tgid is replaced by the new process) and userspace notified.
#[inline(always)]
fn enter_fork(procs: &shared::Procs, tgid: u32, info: &ProcInfo) {
    if !procs.insert(tgid, info, true) {
        count(COUNTER_MAP_FULL);
    }
    notify_proc(EVENT_FORK, tgid, info);
}

/// What both exec programs end with: the entry's new cgroup2 id and name, and the
/// notification.
#[inline(always)]
fn enter_exec(tgid: u32, cgroup_id: u64, comm: [u8; 16]) {
    let (info, stored) = shared::exec_entry(&procs(), tgid, cgroup_id, comm);
    if !stored {
        count(COUNTER_MAP_FULL);
    }
    notify_proc(EVENT_EXEC, tgid, &info);
}

/// What both exit programs end with once the group is dead. Userspace needs only the tgid
/// of an exit: no lookup of the entry before removing it, and a notification of 8 bytes.
#[inline(always)]
fn leave(tgid: u32) {
    procs().remove(tgid);
    if !shared::notify_exit(&EVENTS, cfg!(wakeup_bytes), tgid) {
        count(COUNTER_RINGBUF_LOST);
    }
}

#[tracepoint]
pub fn proc_exec(ctx: TracePointContext) -> u32 {
    match try_proc_exec(&ctx) {
        Ok(()) => 0,
        Err(e) => {
            error!(&ctx, "proc_exec: {}", e);
            0
        }
    }
}

fn try_proc_exec(_ctx: &TracePointContext) -> Result<(), i64> {
    let tgid = current_tgid();
    // exec runs in the process itself: its cgroup2 id is exact here.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    // The new image's name: sched_process_exec fires after the kernel set it.
    let comm = bpf_get_current_comm().unwrap_or([0; 16]);
    enter_exec(tgid, cgroup_id, comm);
    Ok(())
}

#[tracepoint]
pub fn proc_fork(ctx: TracePointContext) -> u32 {
    match try_proc_fork(&ctx) {
        Ok(()) => 0,
        Err(e) => {
            count(COUNTER_READ_ERRORS);
            error!(&ctx, "proc_fork: {}", e);
            0
        }
    }
}

/// `task/task_newtask`, in the parent's context, before the child first runs.
fn try_proc_fork(ctx: &TracePointContext) -> Result<(), i64> {
    let packed: u32 = cfg!(newtask_packed);
    let (child, clone_flags, comm) = if packed != 0 {
        // Plain loads from the record, not the probe-read helper (about 90 ns a fork).
        // SAFETY: the loader set `newtask_packed`: the record has these fields there.
        let r = unsafe { NewTaskRecord::load(ctx.as_ptr() as *const u8) };
        (r.pid, r.clone_flags, Some(r.comm))
    } else {
        let flags_at: u32 = cfg!(newtask_clone_flags);
        let pid_at: u32 = cfg!(newtask_pid);
        let flags: u64 = unsafe { ctx.read_at(flags_at as usize)? };
        let pid: i32 = unsafe { ctx.read_at(pid_at as usize)? };
        (pid, flags, None)
    };
    if clone_flags & CLONE_THREAD != 0 {
        return Ok(()); // a thread, not a new process
    }
    let parent = current_tgid();
    let mut info = ProcInfo::new(
        Some(unsafe { bpf_get_current_cgroup_id() }),
        None,
        // The child's start_boottime was taken microseconds ago in copy_process.
        Some(unsafe { bpf_ktime_get_boot_ns() }),
        parent,
    );
    // The child starts with its parent's name.
    info.comm = comm.unwrap_or_else(|| bpf_get_current_comm().unwrap_or([0; 16]));
    let procs = procs();
    let v1: u32 = cfg!(v1_hierarchy);
    if v1 != ABSENT {
        if let Some(p) = procs.find(parent) {
            let p = unsafe { *p };
            if p.v1_known() {
                info.set_v1(p.cgroup_v1_id);
            }
        }
    }
    if clone_flags & CLONE_INTO_CGROUP != 0 {
        info.mark_suspect();
    }
    enter_fork(&procs, child as u32, &info);
    Ok(())
}

#[tracepoint]
pub fn proc_exit(ctx: TracePointContext) -> u32 {
    match try_proc_exit(&ctx) {
        Ok(()) => 0,
        Err(e) => {
            count(COUNTER_READ_ERRORS);
            error!(&ctx, "proc_exit: {}", e);
            0
        }
    }
}

/// `sched/sched_process_exit` fires per thread; the process ends with its thread group.
fn try_proc_exit(ctx: &TracePointContext) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let group_dead_at: u32 = cfg!(exit_group_dead);
    let group_dead = if group_dead_at == EXIT_GROUP_DEAD_USUAL {
        // A plain load at a constant offset (the verifier wants one), as fork does.
        // SAFETY: in bounds: the loader found the field at this offset.
        unsafe { *(ctx.as_ptr() as *const u8).add(EXIT_GROUP_DEAD_USUAL as usize) != 0 }
    } else if group_dead_at != ABSENT {
        let dead: u8 = unsafe { ctx.read_at(group_dead_at as usize)? };
        dead != 0
    } else {
        pid_tgid as u32 == tgid
    };
    if !group_dead {
        return Ok(());
    }
    leave(tgid);
    Ok(())
}

/// `task_newtask` with BTF: the child itself, read with plain loads. Its own cgroups (so a
/// `CLONE_INTO_CGROUP` child is exact, not suspect), its start time as /proc tells it,
/// its parent as /proc tells it (`real_parent`), its name.
#[btf_tracepoint(function = "task_newtask")]
pub fn proc_fork_btf(ctx: BtfTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    let clone_flags: u64 = ctx.arg(1);
    if clone_flags & CLONE_THREAD != 0 {
        return 0; // a thread, not a new process
    }
    unsafe {
        let tgid = field::<i32>(task, icfg!(task_tgid)) as u32;
        let start: u64 = field(task, icfg!(task_start));
        let parent = field_ptr(task, icfg!(task_parent));
        let ppid = field::<i32>(parent, icfg!(task_tgid)) as u32;
        let (v2, v1) = task_cgroups(&ITER_CONFIG, task);
        let mut info = ProcInfo::new(Some(v2), v1, Some(start), ppid);
        info.comm = task_comm(&ITER_CONFIG, task);
        let procs = procs();
        if v1.is_none() && cfg!(v1_hierarchy) != ABSENT {
            if let Some(p) = procs.find(ppid) {
                let p = *p;
                if p.v1_known() {
                    info.set_v1(p.cgroup_v1_id);
                }
            }
        }
        enter_fork(&procs, tgid, &info);
    }
    0
}

/// `sched_process_exec` with BTF: the process's tgid, cgroups and new name, plain loads.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn proc_exec_btf(ctx: BtfTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    unsafe {
        let tgid = field::<i32>(task, icfg!(task_tgid)) as u32;
        let (v2, _) = task_cgroups(&ITER_CONFIG, task);
        enter_exec(tgid, v2, task_comm(&ITER_CONFIG, task));
    }
    0
}

/// `sched_process_exit` with BTF: the group is dead when no thread of it is left live
/// (`signal->live` is decremented before the tracepoint, on every kernel).
#[btf_tracepoint(function = "sched_process_exit")]
pub fn proc_exit_btf(ctx: BtfTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    unsafe {
        let signal = field_ptr(task, icfg!(task_signal));
        if field::<i32>(signal, icfg!(signal_live)) != 0 {
            return 0;
        }
        leave(field::<i32>(task, icfg!(task_tgid)) as u32);
    }
    0
}

struct CgroupFields {
    root: u32,
    id: u32,
    level: u32,
    path: u32,
}

/// The three cgroup tracepoints share one record layout class; each gets its own offsets.
macro_rules! cgroup_program {
    ($name:ident, $kind:expr, $root:ident, $id:ident, $level:ident, $path:ident) => {
        #[tracepoint]
        pub fn $name(ctx: TracePointContext) -> u32 {
            let f = CgroupFields {
                root: cfg!($root),
                id: cfg!($id),
                level: cfg!($level),
                path: cfg!($path),
            };
            cgroup_event(&ctx, $kind, &f)
        }
    };
}

cgroup_program!(
    cg_mkdir,
    EVENT_CGROUP_MKDIR,
    mkdir_root,
    mkdir_id,
    mkdir_level,
    mkdir_path
);
cgroup_program!(
    cg_rmdir,
    EVENT_CGROUP_RMDIR,
    rmdir_root,
    rmdir_id,
    rmdir_level,
    rmdir_path
);
cgroup_program!(
    cg_attach,
    EVENT_CGROUP_ATTACH,
    attach_root,
    attach_id,
    attach_level,
    attach_path
);

#[inline(always)]
fn cgroup_event(ctx: &TracePointContext, kind: u32, f: &CgroupFields) -> u32 {
    match try_cgroup_event(ctx, kind, f) {
        Ok(()) => 0,
        Err(e) => {
            count(COUNTER_READ_ERRORS);
            error!(ctx, "cgroup event {}: {}", kind, e);
            0
        }
    }
}

fn try_cgroup_event(ctx: &TracePointContext, kind: u32, f: &CgroupFields) -> Result<(), i64> {
    let root: i32 = unsafe { ctx.read_at(f.root as usize)? };
    let root = root as u32;
    let v2 = root == 0;
    let v1: u32 = cfg!(v1_hierarchy);
    if !v2 && root != v1 {
        return Ok(()); // an untracked v1 hierarchy
    }
    let id: u64 = unsafe { ctx.read_at(f.id as usize)? };
    let level: i32 = unsafe { ctx.read_at(f.level as usize)? };
    let mut pid = 0u32;
    if kind == EVENT_CGROUP_ATTACH {
        let pid_at: u32 = cfg!(attach_pid);
        let p: i32 = unsafe { ctx.read_at(pid_at as usize)? };
        pid = p as u32;
        // A missing entry is left to userspace: `pid` may be a lone thread (v1 `tasks`).
        if let Some(e) = procs().find(pid) {
            unsafe { (*e).set_cgroup(v2, id) };
        }
    }
    let loc: u32 = unsafe { ctx.read_at(f.path as usize)? };
    let Some(mut entry) = EVENTS.reserve::<CgroupEvent>(0) else {
        count(COUNTER_RINGBUF_LOST);
        return Ok(());
    };
    let ev = entry.as_mut_ptr();
    unsafe {
        (*ev).kind = kind;
        (*ev).pid = pid;
        (*ev).hierarchy = root;
        (*ev).level = level as u32;
        (*ev).id = id;
        (*ev).path_len = loc >> 16;
        (*ev)._pad = 0;
        // __data_loc: low 16 bits are the offset of the string in the record.
        let src = (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize);
        let dst = &mut *core::ptr::addr_of_mut!((*ev).path);
        if bpf_probe_read_kernel_str_bytes(src, dst).is_err() {
            dst[0] = 0;
        }
        if (loc >> 16) as usize > CGROUP_PATH_MAX {
            dst[CGROUP_PATH_MAX - 1] = 0;
        }
    }
    entry.submit(submit_flags());
    Ok(())
}

/// A kernel value at `base + offset` (offsets from BTF, so read as plain addresses).
#[inline(always)]
fn kread<T>(base: u64, offset: u64) -> Result<T, i32> {
    unsafe { bpf_probe_read_kernel((base + offset) as *const T) }
}

/// The cgroup id (`kernfs_node.id`) of `cgroup`.
#[inline(always)]
fn cgroup_id(cgroup: u64) -> Result<u64, i32> {
    let kn: u64 = kread(cgroup, icfg!(cgroup_kn))?;
    kread(kn, icfg!(kn_id))
}

/// `iter/task`, run once at start-up after the tracepoints are attached: every process
/// that predates them gets its entry here, in the kernel, instead of from a read of
/// /proc/PID/stat and a map insert from userspace per process. Entries the tracepoints
/// wrote since are fresher and kept; only what an exec could not know is filled in.
/// Each process leader's tgid goes to the reader.
#[no_mangle]
#[link_section = "iter/task"]
pub fn proc_iter(ctx: *mut core::ffi::c_void) -> i32 {
    if try_proc_iter(ctx as *const u64).is_err() {
        count(COUNTER_READ_ERRORS);
    }
    0
}

fn try_proc_iter(ctx: *const u64) -> Result<(), i32> {
    // struct bpf_iter__task { struct bpf_iter_meta *meta; struct task_struct *task; }
    let task: u64 = kread(ctx as u64, 8)?;
    if task == 0 || icfg!(enabled) == 0 {
        return Ok(()); // the end of the iteration
    }
    let pid: i32 = kread(task, icfg!(task_pid))?;
    let tgid: i32 = kread(task, icfg!(task_tgid))?;
    if pid != tgid {
        return Ok(()); // a thread
    }
    let tgid = tgid as u32;
    // Every thread of the group has exited (a zombie its parent has not reaped): its exit
    // was before the programs were attached, or its notification is queued. No entry; still
    // reported, so that userspace does not read it from /proc either.
    let signal: u64 = kread(task, icfg!(task_signal))?;
    let live: i32 = kread(signal, icfg!(signal_live))?;
    if live != 0 {
        enter_iterated(task, tgid)?;
    }
    // meta->seq, loaded field by field so the verifier types it as the seq_file.
    let seq = unsafe { *(*(ctx as *const *const *mut seq_file)) };
    unsafe { bpf_seq_write(seq, &tgid as *const u32 as *const _, 4) };
    Ok(())
}

/// The entry of a process the iterator visits, unless the tracepoints wrote a fresher one.
#[inline(always)]
fn enter_iterated(task: u64, tgid: u32) -> Result<(), i32> {
    let start: u64 = kread(task, icfg!(task_start))?;
    let parent: u64 = kread(task, icfg!(task_parent))?;
    let ppid: i32 = if parent == 0 {
        0
    } else {
        kread(parent, icfg!(task_tgid))?
    };
    let cset: u64 = kread(task, icfg!(task_cgroups))?;
    let dfl: u64 = kread(cset, icfg!(cset_dfl_cgrp))?;
    let mut info = ProcInfo::new(Some(cgroup_id(dfl)?), None, Some(start), ppid as u32);
    info.comm = kread(task, icfg!(task_comm))?;
    let v1_css = icfg!(cset_v1_css);
    if v1_css != ABSENT as u64 {
        let css: u64 = kread(cset, v1_css)?;
        let cgroup: u64 = kread(css, icfg!(css_cgroup))?;
        info.set_v1(cgroup_id(cgroup)?);
    }
    let procs = procs();
    match procs.find(tgid) {
        // Written by exec (or fork) since attach: keep it, add what exec could not know.
        Some(p) => unsafe {
            if !(*p).start_known() {
                (*p).start_ns = start;
                (*p).ppid = ppid as u32;
                (*p).flags |= F_START_KNOWN;
            }
            if info.v1_known() && !(*p).v1_known() {
                (*p).set_v1(info.cgroup_v1_id);
            }
        },
        None => {
            if !procs.insert(tgid, &info, false) && procs.find(tgid).is_none() {
                count(COUNTER_MAP_FULL);
            }
        }
    }
    Ok(())
}
