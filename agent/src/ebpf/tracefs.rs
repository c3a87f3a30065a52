//! tracefs: finding or mounting it, and reading tracepoint field offsets from its format
//! files so nothing about this kernel's record layout is hard-coded.
use std::{
    collections::HashMap,
    ffi::CString,
    fs,
    path::{Path, PathBuf},
};

use agent_common::{Config, ABSENT, NEWTASK_OFFSETS};

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// A tracefs mount that has the `events` tree.
pub fn find() -> Option<PathBuf> {
    CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// Called while the process is still single-threaded (unshare(CLONE_NEWNS) fails
/// otherwise). If tracefs is not mounted, mounts it in a mount namespace of the agent's own
/// so the host's mount table is left alone. Returns what was done, for the log.
pub fn prepare_mount_namespace() -> Result<Option<String>, String> {
    if find().is_some() {
        return Ok(None);
    }
    // SAFETY: plain syscalls with valid, NUL-terminated arguments.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(format!(
                "tracefs is not mounted and unshare(CLONE_NEWNS) failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        // Slave, not private: host mounts made later (new cgroup mounts) still reach us.
        let root = CString::new("/").unwrap();
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_SLAVE | libc::MS_REC,
            std::ptr::null(),
        ) != 0
        {
            return Err(format!(
                "making / a slave mount failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        let target = CString::new(CANDIDATES[0]).unwrap();
        let fstype = CString::new("tracefs").unwrap();
        if libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        ) != 0
        {
            return Err(format!(
                "mounting tracefs at {} failed: {}",
                CANDIDATES[0],
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(Some(format!(
        "mounted tracefs at {} in the agent's own mount namespace",
        CANDIDATES[0]
    )))
}

/// In a pod with its own cgroup namespace (containerd's default on cgroup v2),
/// /proc/PID/cgroup shows paths relative to the pod ("/../.."), while the tracepoints report
/// them from the hierarchy's root. With hostPID, PID 1 is the host's init: joining its cgroup
/// namespace makes both agree. Called while single-threaded (setns requires it).
pub fn join_host_cgroup_namespace() -> Result<Option<String>, String> {
    let mine = std::fs::read_link("/proc/self/ns/cgroup").map_err(|e| e.to_string())?;
    let init = match std::fs::read_link("/proc/1/ns/cgroup") {
        Ok(l) => l,
        // Not allowed to look (no privilege): nothing to do, and nothing we could do.
        Err(_) => return Ok(None),
    };
    if mine == init {
        return Ok(None);
    }
    let f = std::fs::File::open("/proc/1/ns/cgroup")
        .map_err(|e| format!("opening /proc/1/ns/cgroup: {e}"))?;
    // SAFETY: a valid namespace fd; single-threaded caller.
    let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWCGROUP) };
    if rc != 0 {
        return Err(format!(
            "joining the host's cgroup namespace failed: {} (cgroup paths may read relative)",
            std::io::Error::last_os_error()
        ));
    }
    Ok(Some("joined the host's cgroup namespace".into()))
}

/// Field name -> (offset, size) of one tracepoint record.
pub type Fields = HashMap<String, (u32, u32)>;

pub fn parse_format(text: &str) -> Fields {
    let mut fields = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut decl = None;
        let mut offset = None;
        let mut size = None;
        for part in rest.split(';') {
            let part = part.trim();
            if let Some(v) = part.strip_prefix("offset:") {
                offset = v.trim().parse().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.trim().parse().ok();
            } else if decl.is_none() && !part.is_empty() {
                decl = Some(part);
            }
        }
        let (Some(decl), Some(offset), Some(size)) = (decl, offset, size) else {
            continue;
        };
        // "unsigned char comm[16]" -> "comm"; "__data_loc char[] path" -> "path".
        let name = decl.rsplit(' ').next().unwrap_or(decl);
        let name = name.split('[').next().unwrap_or(name);
        fields.insert(name.to_string(), (offset, size));
    }
    fields
}

fn read_fields(tracefs: &Path, category: &str, name: &str) -> Result<Fields, String> {
    let path = tracefs
        .join("events")
        .join(category)
        .join(name)
        .join("format");
    let text = fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(parse_format(&text))
}

fn field(fields: &Fields, tp: &str, name: &str, size: Option<u32>) -> Result<u32, String> {
    match fields.get(name) {
        Some(&(off, sz)) if size.is_none_or(|s| s == sz) => Ok(off),
        Some(&(_, sz)) => Err(format!(
            "tracepoint {tp}: field {name} has size {sz}, expected {}",
            size.unwrap()
        )),
        None => Err(format!("tracepoint {tp}: no field {name}")),
    }
}

/// Whether fork may read `task_newtask` as one `NewTaskRecord`.
fn newtask_packed(f: &Fields) -> bool {
    let at = |name, size| field(f, "task_newtask", name, Some(size)).unwrap_or(ABSENT);
    (at("pid", 4), at("comm", 16), at("clone_flags", 8)) == NEWTASK_OFFSETS
}

/// Offsets of every field the programs read, from this kernel's format files.
pub fn offsets(tracefs: &Path) -> Result<Config, String> {
    let mut c = Config::zeroed();
    let f = read_fields(tracefs, "task", "task_newtask")?;
    c.newtask_pid = field(&f, "task_newtask", "pid", Some(4))?;
    c.newtask_clone_flags = field(&f, "task_newtask", "clone_flags", Some(8))?;
    c.newtask_packed = newtask_packed(&f) as u32;
    let f = read_fields(tracefs, "sched", "sched_process_exit")?;
    c.exit_group_dead = field(&f, "sched_process_exit", "group_dead", Some(1)).unwrap_or(ABSENT);
    let f = read_fields(tracefs, "cgroup", "cgroup_attach_task")?;
    c.attach_root = field(&f, "cgroup_attach_task", "dst_root", Some(4))?;
    c.attach_id = field(&f, "cgroup_attach_task", "dst_id", Some(8))?;
    c.attach_level = field(&f, "cgroup_attach_task", "dst_level", Some(4))?;
    c.attach_pid = field(&f, "cgroup_attach_task", "pid", Some(4))?;
    c.attach_path = field(&f, "cgroup_attach_task", "dst_path", Some(4))?;
    let f = read_fields(tracefs, "cgroup", "cgroup_mkdir")?;
    c.mkdir_root = field(&f, "cgroup_mkdir", "root", Some(4))?;
    c.mkdir_id = field(&f, "cgroup_mkdir", "id", Some(8))?;
    c.mkdir_level = field(&f, "cgroup_mkdir", "level", Some(4))?;
    c.mkdir_path = field(&f, "cgroup_mkdir", "path", Some(4))?;
    let f = read_fields(tracefs, "cgroup", "cgroup_rmdir")?;
    c.rmdir_root = field(&f, "cgroup_rmdir", "root", Some(4))?;
    c.rmdir_id = field(&f, "cgroup_rmdir", "id", Some(8))?;
    c.rmdir_level = field(&f, "cgroup_rmdir", "level", Some(4))?;
    c.rmdir_path = field(&f, "cgroup_rmdir", "path", Some(4))?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEWTASK: &str = "name: task_newtask
ID: 134
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;
\tfield:u64 clone_flags;\toffset:32;\tsize:8;\tsigned:0;
\tfield:__data_loc char[] path;\toffset:40;\tsize:4;\tsigned:0;

print fmt: \"pid=%d\"";

    #[test]
    fn parses_offsets_and_sizes() {
        let f = parse_format(NEWTASK);
        assert_eq!(f["pid"], (8, 4));
        assert_eq!(f["comm"], (12, 16));
        assert_eq!(f["clone_flags"], (32, 8));
        assert_eq!(f["path"], (40, 4));
        assert_eq!(field(&f, "t", "clone_flags", Some(8)), Ok(32));
        assert!(field(&f, "t", "clone_flags", Some(4)).is_err());
        assert!(field(&f, "t", "group_dead", Some(1)).is_err());
        assert!(newtask_packed(&f));
        // Another layout: fork falls back to a probe read per field.
        assert!(!newtask_packed(&parse_format(
            &NEWTASK.replace("offset:32", "offset:40")
        )));
    }
}
