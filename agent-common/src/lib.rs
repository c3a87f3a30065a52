//! Types shared by the eBPF programs and the agent. `#[repr(C)]`, no implicit padding
//! (u32 flags rather than bools), so both sides agree byte for byte.
#![no_std]

/// `ProcInfo::flags`: which fields hold a real value.
pub const F_V2_KNOWN: u32 = 1;
pub const F_V1_KNOWN: u32 = 1 << 1;
pub const F_START_KNOWN: u32 = 1 << 2;
/// Forked with CLONE_INTO_CGROUP: the cgroup2 id is the parent's, not necessarily the
/// child's, until the child execs or userspace checks it.
pub const F_CGROUP_SUSPECT: u32 = 1 << 3;

pub const EVENT_EXEC: u32 = 1;
pub const EVENT_FORK: u32 = 2;
pub const EVENT_EXIT: u32 = 3;
pub const EVENT_CGROUP_MKDIR: u32 = 10;
pub const EVENT_CGROUP_RMDIR: u32 = 11;
pub const EVENT_CGROUP_ATTACH: u32 = 12;

/// Indexes into the per-CPU `COUNTERS` array.
pub const COUNTER_RINGBUF_LOST: u32 = 0;
pub const COUNTER_MAP_FULL: u32 = 1;
pub const COUNTER_READ_ERRORS: u32 = 2;
pub const COUNTERS_LEN: u32 = 4;

/// Longest cgroup path carried in an event; longer ones arrive truncated and flagged.
pub const CGROUP_PATH_MAX: usize = 512;
/// `Config` value for "no such field in this kernel's tracepoint" / "no v1 hierarchy".
pub const ABSENT: u32 = u32::MAX;

pub const PROCS_MAP: &str = "PROCS";
pub const SLOTS_MAP: &str = "SLOTS";
pub const EVENTS_MAP: &str = "EVENTS";
pub const COUNTERS_MAP: &str = "COUNTERS";
pub const CONFIG_GLOBAL: &str = "AGENT_CONFIG";
pub const ITER_CONFIG_GLOBAL: &str = "ITER_CONFIG";
/// The start-up task iterator (`iter/task`).
pub const TASK_ITER_PROGRAM: &str = "proc_iter";

/// Value of the kernel `PROCS` map, keyed by tgid: the truth about a process.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcInfo {
    /// cgroup2 id (the inode of the cgroup2 directory).
    pub cgroup_id: u64,
    /// Id in the one tracked cgroup v1 hierarchy (hybrid hosts), 0 if none.
    pub cgroup_v1_id: u64,
    /// Start time, nanoseconds since boot (CLOCK_BOOTTIME), with /proc's tick resolution for
    /// processes that predate the agent.
    pub start_ns: u64,
    pub ppid: u32,
    pub flags: u32,
    /// The command at the last exec (inherited at fork): the resync gets it from here, so
    /// a lost exec notification leaves no stale name behind.
    pub comm: [u8; 16],
}

/// An element of the kernel `SLOTS` array: the entry of the process whose tgid it names
/// (0: free). A process's slot is `tgid & slots_mask`; one whose slot another live process
/// holds has its entry in `PROCS` instead. On the hot paths an array element costs a store
/// where a hash entry costs a hashed, locked insert from a free list (fork 530 ns less,
/// `cargo xtask bench floor`). 64 bytes: one cache line.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    pub tgid: u32,
    pub _pad: u32,
    pub info: ProcInfo,
    pub _reserved: u64,
}

/// The flag rules, in one place for both sides. Always inlined: the eBPF programs call them
/// on map values.
impl ProcInfo {
    /// An entry whose cgroup ids are known only as far as `cgroup_v2` / `cgroup_v1` say,
    /// with a start time when `start_ns` is Some.
    #[inline(always)]
    pub const fn new(
        cgroup_v2: Option<u64>,
        cgroup_v1: Option<u64>,
        start_ns: Option<u64>,
        ppid: u32,
    ) -> ProcInfo {
        let mut info = ProcInfo {
            cgroup_id: 0,
            cgroup_v1_id: 0,
            start_ns: 0,
            ppid,
            flags: 0,
            comm: [0; 16],
        };
        if let Some(id) = cgroup_v2 {
            info.cgroup_id = id;
            info.flags |= F_V2_KNOWN;
        }
        if let Some(id) = cgroup_v1 {
            info.cgroup_v1_id = id;
            info.flags |= F_V1_KNOWN;
        }
        if let Some(t) = start_ns {
            info.start_ns = t;
            info.flags |= F_START_KNOWN;
        }
        info
    }

    #[inline(always)]
    pub const fn v2_known(&self) -> bool {
        self.flags & F_V2_KNOWN != 0
    }

    #[inline(always)]
    pub const fn v1_known(&self) -> bool {
        self.flags & F_V1_KNOWN != 0
    }

    #[inline(always)]
    pub const fn start_known(&self) -> bool {
        self.flags & F_START_KNOWN != 0
    }

    /// The cgroup2 id may be the parent's (CLONE_INTO_CGROUP) until an exec, an attach or
    /// userspace confirms it.
    #[inline(always)]
    pub const fn cgroup_suspect(&self) -> bool {
        self.flags & F_CGROUP_SUSPECT != 0
    }

    /// The cgroup2 id is exact: seen in the process's own context, or moved there.
    #[inline(always)]
    pub fn set_v2(&mut self, id: u64) {
        self.cgroup_id = id;
        self.flags = (self.flags | F_V2_KNOWN) & !F_CGROUP_SUSPECT;
    }

    #[inline(always)]
    pub fn set_v1(&mut self, id: u64) {
        self.cgroup_v1_id = id;
        self.flags |= F_V1_KNOWN;
    }

    /// A fork with CLONE_INTO_CGROUP: the inherited cgroup2 id is not to be trusted yet.
    #[inline(always)]
    pub fn mark_suspect(&mut self) {
        self.flags |= F_CGROUP_SUSPECT;
    }

    /// The same entry with a suspect cgroup2 id treated as unknown.
    #[inline(always)]
    pub const fn trusted(mut self) -> ProcInfo {
        if self.cgroup_suspect() {
            self.flags &= !F_V2_KNOWN;
        }
        self
    }

    /// The entry with `comm` (truncated to 15 bytes, NUL-terminated, as the kernel keeps it).
    pub fn with_comm(mut self, comm: &[u8]) -> ProcInfo {
        let n = comm.len().min(15);
        self.comm = [0; 16];
        self.comm[..n].copy_from_slice(&comm[..n]);
        self
    }

    /// Everything needed to attribute the process without reading /proc: its start time,
    /// a trusted cgroup2 id where cgroup2 is tracked, the v1 id where a v1 hierarchy is.
    #[inline(always)]
    pub const fn is_complete(&self, v2_tracked: bool, v1_tracked: bool) -> bool {
        self.start_known()
            && !self.cgroup_suspect()
            && (!v2_tracked || self.v2_known())
            && (!v1_tracked || self.v1_known())
    }

    /// Whether the entry already knows the process is in cgroup `id` (of cgroup2 when
    /// `v2`, else of the tracked v1 hierarchy).
    #[inline(always)]
    pub const fn knows_cgroup(&self, v2: bool, id: u64) -> bool {
        if v2 {
            self.v2_known() && self.cgroup_id == id
        } else {
            self.v1_known() && self.cgroup_v1_id == id
        }
    }

    /// Records cgroup `id` (of cgroup2 when `v2`, else of the tracked v1 hierarchy).
    #[inline(always)]
    pub fn set_cgroup(&mut self, v2: bool, id: u64) {
        if v2 {
            self.set_v2(id)
        } else {
            self.set_v1(id)
        }
    }
}

/// Ring-buffer notification for exec and fork; the command is `info.comm`.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct ProcEvent {
    pub kind: u32,
    pub tgid: u32,
    pub info: ProcInfo,
}

/// Ring-buffer notification for an exit: the tgid is all userspace needs. 8 bytes, not a
/// `ProcEvent`'s 56: an exit touches less of the ring, and a third of a storm's
/// notifications take an eighth of the room (a ring fills later under overload).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct ExitEvent {
    pub kind: u32,
    pub tgid: u32,
}

/// Ring-buffer notification for cgroup mkdir, rmdir and attach.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct CgroupEvent {
    pub kind: u32,
    /// attach: the moved thread-group leader; 0 otherwise.
    pub pid: u32,
    /// Hierarchy id: 0 is cgroup2, anything else a v1 hierarchy.
    pub hierarchy: u32,
    pub level: u32,
    pub id: u64,
    /// Length of the path in the tracepoint record including the NUL; larger than
    /// `CGROUP_PATH_MAX` means `path` was truncated.
    pub path_len: u32,
    pub _pad: u32,
    pub path: [u8; CGROUP_PATH_MAX],
}

/// Load-time configuration: tracepoint field offsets read from this kernel's format files
/// (never hard-coded), and tunables. Written into the object's .rodata before load.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub newtask_pid: u32,
    pub newtask_clone_flags: u32,
    /// `sched_process_exit.group_dead`, ABSENT on kernels without it (then the leader's
    /// exit ends the process).
    pub exit_group_dead: u32,
    pub attach_root: u32,
    pub attach_id: u32,
    pub attach_pid: u32,
    pub attach_level: u32,
    pub attach_path: u32,
    pub mkdir_root: u32,
    pub mkdir_id: u32,
    pub mkdir_level: u32,
    pub mkdir_path: u32,
    pub rmdir_root: u32,
    pub rmdir_id: u32,
    pub rmdir_level: u32,
    pub rmdir_path: u32,
    /// The tracked cgroup v1 hierarchy id, ABSENT on pure cgroup2 hosts.
    pub v1_hierarchy: u32,
    /// 1 when `task_newtask` has the layout of `NewTaskRecord` (every kernel seen so far):
    /// fork then loads its fields from the record directly (constant offsets), instead of
    /// a probe read per field at these offsets.
    pub newtask_packed: u32,
    /// Wake the consumer once this many bytes are waiting; below it events wait for the
    /// consumer's next timed poll. 0: wake on every event.
    pub wakeup_bytes: u32,
    /// `SLOTS` has `slots_mask + 1` elements (a power of two); 0: entries are in `PROCS`
    /// alone.
    pub slots_mask: u32,
}

impl Config {
    pub const fn zeroed() -> Self {
        Config {
            newtask_pid: 0,
            newtask_clone_flags: 0,
            exit_group_dead: ABSENT,
            attach_root: 0,
            attach_id: 0,
            attach_pid: 0,
            attach_level: 0,
            attach_path: 0,
            mkdir_root: 0,
            mkdir_id: 0,
            mkdir_level: 0,
            mkdir_path: 0,
            rmdir_root: 0,
            rmdir_id: 0,
            rmdir_level: 0,
            rmdir_path: 0,
            v1_hierarchy: ABSENT,
            wakeup_bytes: 0,
            newtask_packed: 0,
            slots_mask: 0,
        }
    }
}

/// Byte offsets the start-up task iterator reads at, from the kernel's BTF (they differ
/// between kernel builds; the programs use no CO-RE). `enabled` is 0 when BTF lacked one.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IterConfig {
    pub enabled: u32,
    /// `task_struct`: pid, tgid, start_boottime, comm, real_parent, cgroups.
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_start: u32,
    pub task_comm: u32,
    pub task_parent: u32,
    pub task_cgroups: u32,
    /// `css_set.dfl_cgrp`: the task's cgroup2 cgroup.
    pub cset_dfl_cgrp: u32,
    /// `css_set.subsys[ssid]` of a controller of the tracked v1 hierarchy; ABSENT if none.
    pub cset_v1_css: u32,
    /// `cgroup_subsys_state.cgroup`, `cgroup.kn`, `kernfs_node.id` (the cgroup id).
    pub css_cgroup: u32,
    pub cgroup_kn: u32,
    pub kn_id: u32,
    /// `task_struct.signal`, `signal_struct.live`: the threads of the group not yet exiting.
    pub task_signal: u32,
    pub signal_live: u32,
}

impl IterConfig {
    pub const fn zeroed() -> Self {
        IterConfig {
            enabled: 0,
            task_pid: 0,
            task_tgid: 0,
            task_start: 0,
            task_comm: 0,
            task_parent: 0,
            task_cgroups: 0,
            cset_dfl_cgrp: 0,
            cset_v1_css: ABSENT,
            css_cgroup: 0,
            cgroup_kn: 0,
            kn_id: 0,
            task_signal: 0,
            signal_live: 0,
        }
    }
}

/// `task/task_newtask` from `pid` on, as 5.x and 6.x kernels lay it out: pid at 8, the
/// child's comm at 12, clone_flags at 32 (`NEWTASK_OFFSETS`).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct NewTaskRecord {
    pub pid: i32,
    pub comm: [u8; 16],
    pub _pad: u32,
    pub clone_flags: u64,
}

/// Where `sched_process_exit` has `group_dead` on the kernels that have it (6.x); exit
/// loads it directly there, and through the probe-read helper at any other offset.
pub const EXIT_GROUP_DEAD_USUAL: u32 = 32;

/// (pid, comm, clone_flags) offsets in the record that `NewTaskRecord` mirrors.
pub const NEWTASK_OFFSETS: (u32, u32, u32) = (8, 12, 32);

const _: () = assert!(core::mem::size_of::<NewTaskRecord>() == 32);

impl NewTaskRecord {
    /// The fields loaded from a `task_newtask` record at `NEWTASK_OFFSETS`, with plain
    /// loads: a tracepoint program may read its record directly at constant offsets (the
    /// verifier checks bounds and alignment), which costs fork about 90 ns less a run than
    /// the probe-read helper, whose code is cold after the kernel's fork path (`cargo xtask
    /// bench floor`).
    ///
    /// # Safety
    /// `rec` points to a `task_newtask` record with this layout (`Config::newtask_packed`).
    #[inline(always)]
    pub unsafe fn load(rec: *const u8) -> NewTaskRecord {
        let (pid_at, comm_at, flags_at) = NEWTASK_OFFSETS;
        // The comm at 12 is 4-aligned only: four 32-bit loads.
        let word = |i: usize| *(rec.add(comm_at as usize + 4 * i) as *const u32);
        NewTaskRecord {
            pid: *(rec.add(pid_at as usize) as *const i32),
            comm: core::mem::transmute::<[u32; 4], [u8; 16]>([word(0), word(1), word(2), word(3)]),
            _pad: 0,
            clone_flags: *(rec.add(flags_at as usize) as *const u64),
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain-old-data, #[repr(C)], every bit pattern valid, no padding.
    unsafe impl aya::Pod for super::ProcInfo {}
    unsafe impl aya::Pod for super::Slot {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::IterConfig {}
}

// Layout guards: these sizes are part of the kernel/userspace contract.
const _: () = assert!(core::mem::size_of::<ProcInfo>() == 48);
const _: () = assert!(core::mem::size_of::<ProcEvent>() == 56);
const _: () = assert!(core::mem::size_of::<ExitEvent>() == 8);
const _: () = assert!(core::mem::size_of::<CgroupEvent>() == 32 + CGROUP_PATH_MAX);
const _: () = assert!(core::mem::size_of::<Slot>() == 64);
const _: () = assert!(core::mem::size_of::<Config>() == 20 * 4);
const _: () = assert!(core::mem::size_of::<IterConfig>() == 14 * 4);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_rules() {
        let mut p = ProcInfo::new(Some(7), None, Some(5), 1);
        assert!(p.v2_known() && !p.v1_known() && p.start_known());
        assert!(p.is_complete(true, false));
        assert!(!p.is_complete(true, true), "v1 tracked but unknown");
        p.mark_suspect();
        assert!(!p.is_complete(true, false));
        assert!(!p.trusted().v2_known(), "a suspect id is not trusted");
        assert!(p.v2_known(), "but kept in the entry");
        assert!(p.knows_cgroup(true, 7));
        p.set_cgroup(true, 9);
        assert!(!p.cgroup_suspect() && p.knows_cgroup(true, 9));
        p.set_cgroup(false, 3);
        assert!(p.knows_cgroup(false, 3) && p.is_complete(true, true));
        let partial = ProcInfo::new(Some(7), None, None, 0);
        assert!(!partial.is_complete(false, false), "no start time");
    }

    /// A `task_newtask` record as the kernel writes it (format file offsets), read back.
    #[test]
    fn a_newtask_record_loads_from_its_format_offsets() {
        #[repr(C, align(8))]
        struct Record([u8; 48]);
        let mut rec = Record([0xee; 48]);
        rec.0[8..12].copy_from_slice(&4242i32.to_ne_bytes());
        rec.0[12..28].copy_from_slice(b"python3\0\0\0\0\0\0\0\0\0");
        rec.0[32..40].copy_from_slice(&0x0001_0000_0011u64.to_ne_bytes());
        let r = unsafe { NewTaskRecord::load(rec.0.as_ptr()) };
        assert_eq!(r.pid, 4242);
        assert_eq!(&r.comm, b"python3\0\0\0\0\0\0\0\0\0");
        assert_eq!(r.clone_flags, 0x0001_0000_0011);
    }
}
