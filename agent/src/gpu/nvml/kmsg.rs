//! The kernel log (`/dev/kmsg`), read for the NVIDIA driver's XID lines, which name the
//! process the error hit: `NVRM: Xid (PCI:0000:3b:00): 43, pid=1234, name=python3, ...`.
//! Read without blocking from where the log stood at start (older lines are not this
//! agent's to count). Any line-oriented source works the same way (a file, a FIFO), which
//! is how the tests feed it when /dev/kmsg cannot be written.
use std::{
    fs::File,
    io::{ErrorKind, Read, Seek, SeekFrom},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

/// One XID line of the NVIDIA driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidLine {
    /// PCI domain, bus and device of the GPU (the line names no function).
    pub pci: (u32, u32, u32),
    pub xid: u64,
    /// The process, when the driver could tell (`pid='<unknown>'` otherwise).
    pub pid: Option<u32>,
    pub comm: Option<String>,
}

/// Parses a kernel log record or a plain line; None unless it is an NVRM XID line.
pub fn parse(line: &str) -> Option<XidLine> {
    // A /dev/kmsg record is "prio,seq,usec,flags;message"; the message is what matters.
    let at = line.find("NVRM: Xid (PCI:")?;
    let rest = &line[at + "NVRM: Xid (PCI:".len()..];
    let (pci, rest) = rest.split_once(')')?;
    let pci = parse_pci(pci)?;
    let rest = rest.strip_prefix(':')?.trim_start();
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let xid = rest[..digits].parse().ok()?;
    let field = |name: &str| -> Option<&str> {
        let i = rest.find(&format!(", {name}="))?;
        let v = &rest[i + name.len() + 3..];
        Some(v[..v.find(',').unwrap_or(v.len())].trim())
    };
    let pid = field("pid").and_then(|p| p.parse().ok());
    let comm = field("name")
        .filter(|n| !n.is_empty() && !n.starts_with('<'))
        .map(str::to_string);
    Some(XidLine {
        pci,
        xid,
        pid,
        comm,
    })
}

/// "0000:3b:00" (the driver's form) or NVML's "00000000:3B:00.0": domain, bus, device.
pub fn parse_pci(s: &str) -> Option<(u32, u32, u32)> {
    let mut parts = s.trim().split(':');
    let (domain, bus, dev) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let dev = dev.split('.').next()?;
    let hex = |p: &str| u32::from_str_radix(p, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(dev)?))
}

/// A non-blocking reader of new lines.
pub struct Kmsg {
    path: PathBuf,
    file: File,
    /// A line not yet ended (file and FIFO sources; /dev/kmsg gives whole records).
    partial: Vec<u8>,
}

impl Kmsg {
    /// Opens `path` at its end. Fails with a reason fit for /debug/stats.
    pub fn open(path: &Path) -> Result<Kmsg, String> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match e.kind() {
                ErrorKind::PermissionDenied => format!(
                    "cannot read {}: {e} (needs CAP_SYSLOG, or kernel.dmesg_restrict=0)",
                    path.display()
                ),
                _ => format!("cannot read {}: {e}", path.display()),
            })?;
        // /dev/kmsg and plain files start at their end; a FIFO cannot seek (and has no past).
        let _ = file.seek(SeekFrom::End(0));
        Ok(Kmsg {
            path: path.to_path_buf(),
            file,
            partial: vec![],
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every XID line that arrived since the last call.
    pub fn read_xids(&mut self) -> Vec<XidLine> {
        let mut out = vec![];
        let mut buf = [0u8; 8192];
        // Bounded: a flood of kernel messages must not stall the sampling cycle.
        for _ in 0..4096 {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.partial.extend_from_slice(&buf[..n]);
                    self.take_lines(&mut out);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // EPIPE: records were overwritten before we read them; go on with the next.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) => {
                    tracing::debug!(path = %self.path.display(), "reading the kernel log: {e}");
                    break;
                }
            }
        }
        out
    }

    fn take_lines(&mut self, out: &mut Vec<XidLine>) {
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            // Continuation lines of a kmsg record (" SUBSYSTEM=...") start with a space.
            if line.first() == Some(&b' ') {
                continue;
            }
            if let Some(x) = parse(&String::from_utf8_lossy(&line)) {
                out.push(x);
            }
        }
        // A runaway line without an end is dropped rather than kept growing.
        if self.partial.len() > 64 << 10 {
            self.partial.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_drivers_xid_lines() {
        let l = parse(
            "4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 43, pid=22717, name=python3, Ch 00000008",
        )
        .unwrap();
        assert_eq!(
            l,
            XidLine {
                pci: (0, 0x3b, 0),
                xid: 43,
                pid: Some(22717),
                comm: Some("python3".into())
            }
        );
        let l = parse("NVRM: Xid (PCI:0000:b1:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception").unwrap();
        assert_eq!((l.xid, l.pid, l.comm), (13, None, None));
        // Older drivers print no process at all.
        let l = parse("NVRM: Xid (PCI:0000:00:04): 31, Ch 00000012, intr 10000000").unwrap();
        assert_eq!((l.pci, l.xid, l.pid), ((0, 0, 4), 31, None));
        let l = parse(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1345, name=python3, GPU has fallen off the bus.",
        )
        .unwrap();
        assert_eq!((l.xid, l.pid), (79, Some(1345)));
        assert_eq!(parse("NVRM: GPU at PCI:0000:3b:00: GPU-abc"), None);
        assert_eq!(parse("usb 1-1: new device"), None);
        assert_eq!(parse_pci("00000000:3B:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(parse_pci("0000:3b:00"), parse_pci("00000000:3B:00.0"));
    }

    #[test]
    fn reads_only_new_lines_from_a_file_source() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("kmsg-test-{}", std::process::id()));
        std::fs::write(&path, "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=old\n").unwrap();
        let mut k = Kmsg::open(&path).unwrap();
        assert!(k.read_xids().is_empty(), "the past is not ours to count");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        write!(
            f,
            "something else\nNVRM: Xid (PCI:0000:3b:00): 79, pid=7, na"
        )
        .unwrap();
        assert!(k.read_xids().is_empty(), "half a line waits");
        writeln!(f, "me=python3, GPU has fallen off the bus.").unwrap();
        let got = k.read_xids();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].xid, got[0].pid), (79, Some(7)));
        assert_eq!(got[0].comm.as_deref(), Some("python3"));
        let _ = std::fs::remove_file(&path);
        let e = Kmsg::open(Path::new("/nonexistent/kmsg")).err().unwrap();
        assert!(e.contains("/nonexistent/kmsg"), "{e}");
    }
}
