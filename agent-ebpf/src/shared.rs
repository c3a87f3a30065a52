//! What the agent's programs (main.rs) and the calibration object (floor.rs) share: the
//! steps, so that `cargo xtask bench floor` times the agent's own code (each binary passes
//! its maps), and what every eBPF binary needs (panic handler, license).
use agent_common::{ExitEvent, IterConfig, ProcEvent, ProcInfo, Slot, ABSENT, EVENT_EXIT};
use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    maps::{Array, HashMap, RingBuf},
};

/// The process entries: in a process's slot of `slots` where it holds it, else in `hash`
/// (its slot held by another live process, or written by userspace, which never claims a
/// slot). A slot is claimed by the program that creates the entry and freed at the exit.
/// No atomics: two processes whose tgids share a slot would both have to be forked in the
/// same instant, when tgids are handed out one after another.
pub struct Procs<'a> {
    pub hash: &'a HashMap<u32, ProcInfo>,
    pub slots: &'a Array<Slot>,
    /// `Config::slots_mask`.
    pub mask: u32,
}

impl Procs<'_> {
    #[inline(always)]
    fn slot(&self, tgid: u32) -> Option<*mut Slot> {
        if self.mask == 0 {
            return None;
        }
        self.slots.get_ptr_mut(tgid & self.mask)
    }

    /// The entry of `tgid`, wherever it is.
    #[inline(always)]
    pub fn find(&self, tgid: u32) -> Option<*mut ProcInfo> {
        if let Some(s) = self.slot(tgid) {
            // SAFETY: a map value, valid for the program's run.
            unsafe {
                if (*s).tgid == tgid {
                    return Some(core::ptr::addr_of_mut!((*s).info));
                }
            }
        }
        self.hash.get_ptr_mut(tgid)
    }

    /// Stores the entry of a process with none yet: in its slot if free, else in the hash
    /// (`BPF_ANY` for a new process: a stale entry under a reused tgid is replaced;
    /// `BPF_NOEXIST` otherwise: the one that exists is fresher). False: no room.
    #[inline(always)]
    pub fn insert(&self, tgid: u32, info: &ProcInfo, replace: bool) -> bool {
        if let Some(s) = self.slot(tgid) {
            // SAFETY: as in `find`.
            unsafe {
                let holder = (*s).tgid;
                if holder == 0 || holder == tgid {
                    (*s).info = *info;
                    (*s).tgid = tgid;
                    return true;
                }
            }
        }
        let flags = if replace { BPF_ANY } else { BPF_NOEXIST };
        self.hash.insert(tgid, info, flags as u64).is_ok()
    }

    /// The exit: the slot freed if the process holds it, else its hash entry removed.
    #[inline(always)]
    pub fn remove(&self, tgid: u32) {
        if let Some(s) = self.slot(tgid) {
            // SAFETY: as in `find`.
            unsafe {
                if (*s).tgid == tgid {
                    (*s).tgid = 0;
                    return;
                }
            }
        }
        let _ = self.hash.remove(tgid);
    }
}

/// One field of the binary's `IterConfig` static. Volatile: the value is patched into the
/// frozen .rodata at load time, after compilation, and the verifier reads it as a constant.
#[inline(always)]
fn at(cfg: &IterConfig, field: impl FnOnce(&IterConfig) -> &u32) -> u64 {
    // SAFETY: a reference to a static's field.
    unsafe { core::ptr::read_volatile(field(cfg)) as u64 }
}

/// A field of a kernel object whose type the verifier knows from BTF (a `tp_btf` argument,
/// or a pointer loaded from one), at an offset from this kernel's BTF (`IterConfig`, in
/// the frozen .rodata: the verifier sees a constant). A plain load: no helper call, where
/// each call costs a return through this host's mitigation thunks.
#[inline(always)]
pub unsafe fn field<T: Copy>(base: *const u8, offset: u64) -> T {
    core::ptr::read(base.add(offset as usize) as *const T)
}

/// A pointer field of a kernel object, as `field`.
#[inline(always)]
pub unsafe fn field_ptr(base: *const u8, offset: u64) -> *const u8 {
    field::<u64>(base, offset) as *const u8
}

/// `task`'s cgroup2 id, and the id of its cgroup in the tracked v1 hierarchy when that has
/// a controller (else None: the caller takes the parent's). `cfg`: the binary's static.
#[inline(always)]
pub unsafe fn task_cgroups(cfg: &IterConfig, task: *const u8) -> (u64, Option<u64>) {
    let cset = field_ptr(task, at(cfg, |c| &c.task_cgroups));
    let dfl = field_ptr(cset, at(cfg, |c| &c.cset_dfl_cgrp));
    let kn = at(cfg, |c| &c.cgroup_kn);
    let kn_id = at(cfg, |c| &c.kn_id);
    let v2 = field::<u64>(field_ptr(dfl, kn), kn_id);
    let v1_css = at(cfg, |c| &c.cset_v1_css);
    if v1_css == ABSENT as u64 {
        return (v2, None);
    }
    let css = field_ptr(cset, v1_css);
    let cgroup = field_ptr(css, at(cfg, |c| &c.css_cgroup));
    let v1 = field::<u64>(field_ptr(cgroup, kn), kn_id);
    (v2, Some(v1))
}

/// `task->comm`, two plain loads.
#[inline(always)]
pub unsafe fn task_comm(cfg: &IterConfig, task: *const u8) -> [u8; 16] {
    let at = at(cfg, |c| &c.task_comm);
    let lo: u64 = field(task, at);
    let hi: u64 = field(task, at + 8);
    let mut comm = [0u8; 16];
    comm[..8].copy_from_slice(&lo.to_ne_bytes());
    comm[8..].copy_from_slice(&hi.to_ne_bytes());
    comm
}

/// Wake the consumer only when `wakeup_bytes` have piled up (0: on every event); it polls
/// on a timer otherwise.
#[inline(always)]
pub fn wakeup_flags(ring: &RingBuf, wakeup_bytes: u32) -> u64 {
    if wakeup_bytes == 0 || ring.query(BPF_RB_AVAIL_DATA as u64) >= wakeup_bytes as u64 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// A fork or exec notification. False when the ring is full.
#[inline(always)]
pub fn notify_proc(
    ring: &RingBuf,
    wakeup_bytes: u32,
    kind: u32,
    tgid: u32,
    info: &ProcInfo,
) -> bool {
    let Some(mut entry) = ring.reserve::<ProcEvent>(0) else {
        return false;
    };
    let ev = entry.as_mut_ptr();
    unsafe {
        (*ev).kind = kind;
        (*ev).tgid = tgid;
        (*ev).info = *info;
    }
    entry.submit(wakeup_flags(ring, wakeup_bytes));
    true
}

/// An exit notification: the tgid is all userspace needs. False when the ring is full.
#[inline(always)]
pub fn notify_exit(ring: &RingBuf, wakeup_bytes: u32, tgid: u32) -> bool {
    let Some(mut entry) = ring.reserve::<ExitEvent>(0) else {
        return false;
    };
    entry.write(ExitEvent {
        kind: EVENT_EXIT,
        tgid,
    });
    entry.submit(wakeup_flags(ring, wakeup_bytes));
    true
}

/// An event copied into the ring by one helper (`bpf_ringbuf_output`, from the stack), where
/// `notify_proc` and `notify_exit` reserve and submit: measured against them by `cargo xtask
/// bench floor`. False when the ring is full.
#[allow(dead_code)] // the calibration object's
#[inline(always)]
pub fn output<T>(ring: &RingBuf, wakeup_bytes: u32, event: &T) -> bool {
    ring.output::<T>(event, wakeup_flags(ring, wakeup_bytes))
        .is_ok()
}

/// exec's entry: the new image's cgroup2 id and name, in place; inserted where the entry is
/// missing (the process predates the start-up walk, or the map was full), and userspace
/// fills in the rest. Returns it, and false when the insert failed.
#[inline(always)]
pub fn exec_entry(procs: &Procs, tgid: u32, cgroup_id: u64, comm: [u8; 16]) -> (ProcInfo, bool) {
    match procs.find(tgid) {
        Some(p) => unsafe {
            (*p).set_v2(cgroup_id);
            (*p).comm = comm;
            (*p, true)
        },
        None => {
            let mut info = ProcInfo::new(Some(cgroup_id), None, None, 0);
            info.comm = comm;
            let inserted = procs.insert(tgid, &info, false);
            (info, inserted)
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
