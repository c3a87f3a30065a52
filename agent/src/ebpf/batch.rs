//! The kernel's batch lookup on a map with u32 keys (Linux 5.6): thousands of entries per
//! syscall, where aya's iterator makes two syscalls per entry. Every resync reads the whole
//! of SLOTS and PROCS, 50,000 entries on a large node. Any error makes the caller fall back to aya's
//! iterator. (The seed cannot be batched: a batch update takes no BPF_NOEXIST, and the
//! seed must not overwrite the kernel's fresher entries.)
use std::{io, mem::size_of, os::fd::RawFd};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Entries per syscall.
const CHUNK: usize = 4096;

/// `union bpf_attr`'s `batch` member.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

fn bpf(cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: `attr` is a valid bpf_attr prefix of the size passed; the pointers in it
    // point at buffers of `count` keys and values that outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            size_of::<BatchAttr>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Every (key, value) of a map with u32 keys (a hash map, an array). `V` must be the map's
/// value type.
pub fn lookup_all<V: Copy + Default>(fd: RawFd) -> io::Result<Vec<(u32, V)>> {
    lookup_kept(fd, |k, v| Some((k, v)))
}

/// What `keep` makes of each (key, value) of such a map, where it makes something: an
/// array's empty elements are dropped a chunk at a time, not copied out whole first.
pub fn lookup_kept<V: Copy + Default, T>(
    fd: RawFd,
    mut keep: impl FnMut(u32, V) -> Option<T>,
) -> io::Result<Vec<T>> {
    let mut keys = vec![0u32; CHUNK];
    let mut values = vec![V::default(); CHUNK];
    let mut out = vec![];
    // The position is a bucket index the kernel hands back (u32 for a hash map).
    let (mut token, mut next) = (0u32, 0u32);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &token as *const u32 as u64
            },
            out_batch: &mut next as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd as u32,
            ..Default::default()
        };
        let r = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let n = (attr.count as usize).min(CHUNK);
        out.extend((keys[..n].iter().zip(&values[..n])).filter_map(|(k, v)| keep(*k, *v)));
        match r {
            Ok(()) => {
                token = next;
                first = false;
            }
            // The end of the map: this call's entries were still copied.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e),
        }
    }
}
