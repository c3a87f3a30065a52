//! Ctrl-C, a closed terminal or a `kill`: the handler only notes the signal; the demo's
//! wait loops see it, stop the agent, and unwind, so that every guard removes what it made.
use std::sync::atomic::{AtomicI32, Ordering};

static CAUGHT: AtomicI32 = AtomicI32::new(0);

extern "C" fn note(sig: libc::c_int) {
    CAUGHT.store(sig, Ordering::SeqCst);
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT no longer end xtask; [`caught`] says when one came.
pub fn catch() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = note as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The signal that came, if one did.
pub fn caught() -> Option<i32> {
    match CAUGHT.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}
