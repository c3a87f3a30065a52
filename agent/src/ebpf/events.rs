//! Kernel notifications, decoded where they are read: the ring buffer's records become
//! `KernelEvent`s here, and nowhere else touches their bytes.
use agent_common::{
    CgroupEvent, ExitEvent, ProcEvent, ProcInfo, CGROUP_PATH_MAX, EVENT_CGROUP_ATTACH,
    EVENT_CGROUP_MKDIR, EVENT_CGROUP_RMDIR, EVENT_EXEC, EVENT_EXIT, EVENT_FORK,
};

/// One notification from the programs. The kernel `PROCS` map stays the truth; these only
/// say what changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelEvent {
    /// A new thread group (a process), with what it inherited.
    Fork {
        tgid: u32,
        info: ProcInfo,
        comm: Comm,
    },
    /// A process replaced its image; `info` is its kernel entry after the exec.
    Exec {
        tgid: u32,
        info: ProcInfo,
        comm: Comm,
    },
    /// A thread group ended.
    Exit {
        tgid: u32,
    },
    /// A cgroup appeared. `path` is None when the record could not carry it (truncated):
    /// the hierarchy must be walked to learn it.
    CgroupMkdir {
        hierarchy: u32,
        id: u64,
        path: Option<String>,
    },
    CgroupRmdir {
        hierarchy: u32,
        id: u64,
    },
    /// A thread-group leader moved into cgroup `id` of `hierarchy` (0 is cgroup2).
    CgroupAttach {
        pid: u32,
        hierarchy: u32,
        id: u64,
        path: Option<String>,
    },
}

/// Decodes one ring-buffer record; None for a record this build does not know (a newer
/// program, or a short record).
pub fn decode(bytes: &[u8]) -> Option<KernelEvent> {
    let kind = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    match kind {
        EVENT_EXEC | EVENT_FORK => {
            let ev: ProcEvent = read(bytes)?;
            let comm = comm_str(&ev.info.comm);
            let (tgid, info) = (ev.tgid, ev.info);
            Some(match kind {
                EVENT_FORK => KernelEvent::Fork { tgid, info, comm },
                _ => KernelEvent::Exec { tgid, info, comm },
            })
        }
        EVENT_EXIT => {
            let ev: ExitEvent = read(bytes)?;
            Some(KernelEvent::Exit { tgid: ev.tgid })
        }
        EVENT_CGROUP_MKDIR | EVENT_CGROUP_RMDIR | EVENT_CGROUP_ATTACH => {
            let ev: CgroupEvent = read(bytes)?;
            let (hierarchy, id) = (ev.hierarchy, ev.id);
            Some(match kind {
                EVENT_CGROUP_RMDIR => KernelEvent::CgroupRmdir { hierarchy, id },
                EVENT_CGROUP_MKDIR => KernelEvent::CgroupMkdir {
                    hierarchy,
                    id,
                    path: cgroup_path(&ev),
                },
                _ => KernelEvent::CgroupAttach {
                    pid: ev.pid,
                    hierarchy,
                    id,
                    path: cgroup_path(&ev),
                },
            })
        }
        _ => None,
    }
}

/// The one unsafe read of a record.
fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the length is checked, and T (ProcEvent, ExitEvent, CgroupEvent) is #[repr(C)]
    // plain old data for which every bit pattern is valid.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) })
}

fn cgroup_path(ev: &CgroupEvent) -> Option<String> {
    let truncated = ev.path_len as usize > CGROUP_PATH_MAX;
    let end = ev.path.iter().position(|&b| b == 0).unwrap_or(0);
    (!truncated && end > 0).then(|| String::from_utf8_lossy(&ev.path[..end]).into_owned())
}

pub fn comm_str(comm: &[u8; 16]) -> Comm {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    // Borrowed, not copied, when the bytes are UTF-8 (nearly always).
    Comm::new(&String::from_utf8_lossy(&comm[..end]))
}

/// A process's command as the kernel keeps it (`TASK_COMM_LEN`: 15 bytes), inline: a
/// process in the cache, and each notification, costs no allocation for it.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Comm {
    len: u8,
    bytes: [u8; 15],
}

impl Comm {
    /// `s` cut to 15 bytes at a character boundary, as the kernel cuts a longer name.
    pub fn new(s: &str) -> Comm {
        let mut end = s.len().min(15);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0; 15];
        bytes[..end].copy_from_slice(&s.as_bytes()[..end]);
        Comm {
            len: end as u8,
            bytes,
        }
    }

    pub fn as_str(&self) -> &str {
        // Made from a &str cut at a character boundary.
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or_default()
    }
}

impl std::ops::Deref for Comm {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Comm {
    fn from(s: &str) -> Comm {
        Comm::new(s)
    }
}

impl From<String> for Comm {
    fn from(s: String) -> Comm {
        Comm::new(&s)
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain #[repr(C)] value.
        unsafe { std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }.to_vec()
    }

    #[test]
    fn a_comm_is_cut_like_the_kernel_cuts_it() {
        assert_eq!(&*comm_str(b"python\0\0\0\0\0\0\0\0\0\0"), "python");
        assert_eq!(&*comm_str(b"0123456789abcdef"), "0123456789abcde");
        assert_eq!(
            &*Comm::new("kworker/u8:1-events_unbound"),
            "kworker/u8:1-ev"
        );
        // Never in the middle of a character: 'é' is two bytes, at 14 and 15.
        assert_eq!(&*Comm::new("abcdefghijklmné"), "abcdefghijklmn");
        assert_eq!(
            &*comm_str(b"ab\xffc\0\0\0\0\0\0\0\0\0\0\0\0"),
            "ab\u{fffd}c"
        );
    }

    #[test]
    fn process_records() {
        let info = ProcInfo::new(Some(7), None, Some(9), 1).with_comm(b"python");
        let mut ev = ProcEvent {
            kind: EVENT_FORK,
            tgid: 42,
            info,
        };
        let fork = KernelEvent::Fork {
            tgid: 42,
            info,
            comm: "python".into(),
        };
        assert_eq!(decode(&bytes(&ev)), Some(fork));
        // An exit is 8 bytes: kind and tgid.
        let exit = ExitEvent {
            kind: EVENT_EXIT,
            tgid: 42,
        };
        assert_eq!(bytes(&exit).len(), 8);
        assert_eq!(decode(&bytes(&exit)), Some(KernelEvent::Exit { tgid: 42 }));
        assert_eq!(decode(&bytes(&exit)[..6]), None);
        // Short or unknown records are skipped, not misread.
        assert_eq!(decode(&bytes(&ev)[..20]), None);
        ev.kind = 99;
        assert_eq!(decode(&bytes(&ev)), None);
        assert_eq!(decode(&[1, 0]), None);
    }

    #[test]
    fn cgroup_records_and_truncated_paths() {
        let mut ev = CgroupEvent {
            kind: EVENT_CGROUP_ATTACH,
            pid: 5,
            hierarchy: 0,
            level: 2,
            id: 77,
            path_len: 6,
            _pad: 0,
            path: [0; CGROUP_PATH_MAX],
        };
        ev.path[..5].copy_from_slice(b"/a/bc");
        let attach = KernelEvent::CgroupAttach {
            pid: 5,
            hierarchy: 0,
            id: 77,
            path: Some("/a/bc".into()),
        };
        assert_eq!(decode(&bytes(&ev)), Some(attach));
        ev.kind = EVENT_CGROUP_MKDIR;
        ev.path_len = CGROUP_PATH_MAX as u32 + 1;
        let truncated = KernelEvent::CgroupMkdir {
            hierarchy: 0,
            id: 77,
            path: None,
        };
        assert_eq!(decode(&bytes(&ev)), Some(truncated));
        ev.kind = EVENT_CGROUP_RMDIR;
        let rmdir = KernelEvent::CgroupRmdir {
            hierarchy: 0,
            id: 77,
        };
        assert_eq!(decode(&bytes(&ev)), Some(rmdir));
    }
}
