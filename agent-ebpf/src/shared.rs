//! What the agent's programs (main.rs) and the calibration object (floor.rs) share: the
//! steps, so that `cargo xtask bench floor` times the agent's own code (each binary passes
//! its maps), and what every eBPF binary needs (panic handler, license).
use agent_common::{ExitEvent, ProcEvent, ProcInfo, Slot, EVENT_EXIT};
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
