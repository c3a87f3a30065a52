//! What the agent's programs (main.rs) and the calibration object (floor.rs) share: the
//! steps, so that `cargo xtask bench floor` times the agent's own code (each binary passes
//! its maps), and what every eBPF binary needs (panic handler, license).
use agent_common::{ExitEvent, ProcEvent, ProcInfo, EVENT_EXIT};
use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    maps::{HashMap, RingBuf},
};

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
pub fn exec_entry(
    procs: &HashMap<u32, ProcInfo>,
    tgid: u32,
    cgroup_id: u64,
    comm: [u8; 16],
) -> (ProcInfo, bool) {
    match procs.get_ptr_mut(tgid) {
        Some(p) => unsafe {
            (*p).set_v2(cgroup_id);
            (*p).comm = comm;
            (*p, true)
        },
        None => {
            let mut info = ProcInfo::new(Some(cgroup_id), None, None, 0);
            info.comm = comm;
            let inserted = procs.insert(tgid, info, BPF_NOEXIST as u64).is_ok();
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
