//! Cgroup hierarchies and the registry of cgroups (hierarchy, id) -> path and parsed
//! container reference. Paths are parsed once per cgroup, never per process.
pub mod parse;

use std::{
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use gpu_model::Name;
use rustc_hash::FxHashMap;

pub use parse::{parse_cgroup_path, ContainerRef, Qos, Runtime};

/// One mounted cgroup hierarchy the agent follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Kernel hierarchy id: 0 for cgroup2.
    pub id: u32,
    /// "cgroup2", or the v1 controllers ("memory", "cpu,cpuacct", "name=systemd").
    pub name: String,
    pub mount_point: PathBuf,
    /// The cgroup path this mount shows as its root ("/" for a host mount).
    pub mount_root: PathBuf,
}

impl Hierarchy {
    pub fn is_v2(&self) -> bool {
        self.id == 0
    }

    /// The directory of a cgroup path (as the kernel and /proc/PID/cgroup write it).
    pub fn dir_of(&self, path: &str) -> Option<PathBuf> {
        let rel = Path::new(path).strip_prefix(&self.mount_root).ok()?;
        Some(self.mount_point.join(rel))
    }

    /// The path of cgroup `id`, asked of the kernel: a cgroup id is its kernfs file handle,
    /// so `open_by_handle_at` on the hierarchy's mount opens its directory without a walk.
    /// Needs CAP_DAC_READ_SEARCH; None when the cgroup is gone or the call is refused.
    pub fn path_of_id(&self, id: u64) -> Option<String> {
        /// `struct file_handle` with the 8 bytes of a kernfs handle.
        #[repr(C)]
        struct KernfsHandle {
            handle_bytes: u32,
            handle_type: i32,
            id: u64,
        }
        const FILEID_KERNFS: i32 = 0xfe;
        let mount = std::fs::File::open(&self.mount_point).ok()?;
        let mut handle = KernfsHandle {
            handle_bytes: 8,
            handle_type: FILEID_KERNFS,
            id,
        };
        // SAFETY: `handle` is a valid file_handle header followed by its 8 bytes, and
        // `mount` an open directory.
        let fd = unsafe {
            libc::open_by_handle_at(
                mount.as_raw_fd(),
                (&mut handle as *mut KernfsHandle).cast(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: a new fd we own.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        let link = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())).ok()?;
        let rel = link.strip_prefix(&self.mount_point).ok()?;
        Some(self.mount_root.join(rel).to_string_lossy().into_owned())
    }
}

#[derive(Debug, Clone, Default)]
pub struct Hierarchies {
    pub v2: Option<Hierarchy>,
    pub v1: Option<Hierarchy>,
}

const V1_PREFERENCE: [&str; 4] = ["memory", "cpu", "pids", "name=systemd"];

impl Hierarchies {
    /// Finds the cgroup2 mount and the v1 hierarchy to follow (`choice`: "auto", "none" or a
    /// controller) from mountinfo and /proc/self/cgroup.
    pub fn detect(proc_root: &Path, choice: &str) -> Hierarchies {
        let mountinfo =
            std::fs::read_to_string(proc_root.join("self/mountinfo")).unwrap_or_default();
        let self_cgroup =
            std::fs::read_to_string(proc_root.join("self/cgroup")).unwrap_or_default();
        Self::from_texts(&mountinfo, &self_cgroup, choice)
    }

    pub fn from_texts(mountinfo: &str, self_cgroup: &str, choice: &str) -> Hierarchies {
        let mut v2 = None;
        let mut v1_mounts = vec![];
        for line in mountinfo.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            if pre.len() < 5 || post.len() < 3 {
                continue;
            }
            let (root, point) = (unescape(pre[3]), unescape(pre[4]));
            match post[0] {
                "cgroup2" if v2.is_none() => {
                    v2 = Some(Hierarchy {
                        id: 0,
                        name: "cgroup2".into(),
                        mount_point: point.into(),
                        mount_root: root.into(),
                    })
                }
                "cgroup" => {
                    let opts: Vec<&str> = post[2].split(',').collect();
                    v1_mounts.push((opts, PathBuf::from(point), PathBuf::from(root)));
                }
                _ => {}
            }
        }
        // /proc/self/cgroup: "4:memory:/path", "1:name=systemd:/path": hierarchy ids.
        let ids: Vec<(u32, Vec<&str>)> = self_cgroup
            .lines()
            .filter_map(|l| {
                let mut it = l.splitn(3, ':');
                let id = it.next()?.parse().ok()?;
                let ctrls = it.next()?;
                (id != 0).then(|| (id, ctrls.split(',').collect()))
            })
            .collect();
        let v1_for = |want: &str| -> Option<Hierarchy> {
            let (ctrls_id, ctrls) = ids.iter().find(|(_, c)| c.contains(&want))?;
            let (_, point, root) = v1_mounts
                .iter()
                .find(|(opts, _, _)| ctrls.iter().all(|c| opts.contains(c)))?;
            Some(Hierarchy {
                id: *ctrls_id,
                name: ctrls.join(","),
                mount_point: point.clone(),
                mount_root: root.clone(),
            })
        };
        let v1 = match choice {
            "none" => None,
            "auto" => V1_PREFERENCE.iter().find_map(|c| v1_for(c)),
            c => v1_for(c),
        };
        Hierarchies { v2, v1 }
    }

    pub fn all(&self) -> impl Iterator<Item = &Hierarchy> {
        self.v2.iter().chain(self.v1.iter())
    }

    pub fn by_id(&self, id: u32) -> Option<&Hierarchy> {
        self.all().find(|h| h.id == id)
    }
}

/// mountinfo escapes spaces and the like as \040.
fn unescape(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Debug, Clone)]
pub struct CgroupNode {
    pub path: Name,
    pub container: Option<Arc<ContainerRef>>,
    removed_at: Option<Instant>,
}

/// (hierarchy id, cgroup id) -> node. v1 and v2 ids come from different kernfs roots and
/// may collide, hence the hierarchy in the key.
#[derive(Debug, Default)]
pub struct CgroupRegistry {
    /// Fx: the kernel's ids, looked up per GPU process each cycle.
    nodes: FxHashMap<(u32, u64), CgroupNode>,
    /// The earliest removal not yet forgotten: gc walks the nodes only once one is due.
    oldest_removal: Option<Instant>,
    /// The last pod uid parsed. A pod's cgroups come one after another (the walk, the
    /// kubelet's mkdirs), so its containers share one string: 9,000 fewer on a node of
    /// 1,000 pods.
    last_pod_uid: Option<Name>,
}

impl CgroupRegistry {
    pub fn insert(&mut self, hierarchy: u32, id: u64, path: &str) {
        if let Some(n) = self.nodes.get_mut(&(hierarchy, id)) {
            if &*n.path == path {
                n.removed_at = None;
                return;
            }
        }
        let container = parse_cgroup_path(path).map(|mut c| {
            if let Some(uid) = &mut c.pod_uid {
                match &self.last_pod_uid {
                    Some(last) if **last == **uid => *uid = last.clone(),
                    _ => self.last_pod_uid = Some(uid.clone()),
                }
            }
            Arc::new(c)
        });
        self.nodes.insert(
            (hierarchy, id),
            CgroupNode {
                path: path.into(),
                container,
                removed_at: None,
            },
        );
    }

    /// rmdir: kept a while for exited processes that still point at it.
    pub fn mark_removed(&mut self, hierarchy: u32, id: u64) {
        if let Some(n) = self.nodes.get_mut(&(hierarchy, id)) {
            let now = Instant::now();
            n.removed_at = Some(now);
            self.oldest_removal.get_or_insert(now);
        }
    }

    pub fn get(&self, hierarchy: u32, id: u64) -> Option<&CgroupNode> {
        self.nodes.get(&(hierarchy, id))
    }

    pub fn contains(&self, hierarchy: u32, id: u64) -> bool {
        self.nodes.contains_key(&(hierarchy, id))
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Forgets cgroups removed longer than `keep` ago. Returns the containers that no longer
    /// have any cgroup here: they are gone.
    pub fn gc(&mut self, keep: Duration) -> Vec<String> {
        let now = Instant::now();
        if self
            .oldest_removal
            .is_none_or(|t| now.duration_since(t) < keep)
        {
            return vec![];
        }
        let mut gone = vec![];
        self.nodes.retain(|_, n| {
            let keep = n.removed_at.is_none_or(|t| now.duration_since(t) < keep);
            if !keep {
                if let Some(id) = n.container.as_ref().and_then(|c| c.container_id.as_deref()) {
                    gone.push(id.to_string());
                }
            }
            keep
        });
        self.oldest_removal = self.nodes.values().filter_map(|n| n.removed_at).min();
        // A container has a cgroup in each hierarchy: gone once none is left.
        gone.sort_unstable();
        gone.dedup();
        gone.retain(|id| {
            !self.nodes.values().any(|n| {
                n.container.as_ref().and_then(|c| c.container_id.as_deref()) == Some(id.as_str())
            })
        });
        gone
    }

    /// One walk of a hierarchy's cgroup filesystem (start-up, or a cgroup id nobody told us
    /// about). Returns the number of cgroups seen.
    pub fn walk(&mut self, h: &Hierarchy) -> usize {
        self.walk_inner(h, None)
    }

    /// The walk, also reading each cgroup's `cgroup.procs`: (pid, cgroup id) of every
    /// process in the hierarchy, for the start-up walk. One read per cgroup instead of a
    /// /proc/PID/cgroup read and a stat per process (10,000 reads, not 100,000, on a large
    /// node).
    pub fn walk_members(&mut self, h: &Hierarchy, members: &mut Vec<(u32, u64)>) -> usize {
        self.walk_inner(h, Some(members))
    }

    fn walk_inner(&mut self, h: &Hierarchy, mut members: Option<&mut Vec<(u32, u64)>>) -> usize {
        let mut seen = 0;
        let mut buf = String::new();
        let mut stack = vec![(
            h.mount_point.clone(),
            h.mount_root.to_string_lossy().into_owned(),
        )];
        while let Some((dir, path)) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            self.insert(h.id, meta.ino(), &path);
            seen += 1;
            if let Some(m) = members.as_deref_mut() {
                read_procs(&dir.join("cgroup.procs"), meta.ino(), &mut buf, m);
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let child = if path.ends_with('/') {
                        format!("{path}{name}")
                    } else {
                        format!("{path}/{name}")
                    };
                    stack.push((e.path(), child));
                }
            }
        }
        seen
    }

    /// The id of a cgroup path, from the registry or by stat-ing its directory.
    pub fn id_of(&mut self, h: &Hierarchy, path: &str) -> Option<u64> {
        let dir = h.dir_of(path)?;
        let ino = std::fs::metadata(dir).ok()?.ino();
        if !self.contains(h.id, ino) {
            self.insert(h.id, ino, path);
        }
        Some(ino)
    }
}

/// Appends (pid, id) for each pid in a `cgroup.procs` file (gone or unreadable: none).
fn read_procs(file: &Path, id: u64, buf: &mut String, out: &mut Vec<(u32, u64)>) {
    use std::io::Read;
    buf.clear();
    let ok = std::fs::File::open(file).and_then(|mut f| f.read_to_string(buf));
    if ok.is_ok() {
        out.extend(buf.lines().filter_map(|l| Some((l.parse().ok()?, id))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 1 0:23 / /sys rw,nosuid - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
27 26 0:25 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
28 26 0:26 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd
31 26 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
32 26 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
33 26 0:31 /kubepods /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
";
    const SELF_CGROUP: &str = "\
12:pids:/
6:memory:/user.slice
4:cpu,cpuacct:/
1:name=systemd:/user.slice/session-1.scope
0::/user.slice/session-1.scope
";

    #[test]
    fn hybrid_host_prefers_memory() {
        let h = Hierarchies::from_texts(MOUNTINFO, SELF_CGROUP, "auto");
        let v2 = h.v2.unwrap();
        assert_eq!(v2.mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
        let v1 = h.v1.unwrap();
        assert_eq!((v1.id, v1.name.as_str()), (6, "memory"));
        assert_eq!(v1.mount_point, PathBuf::from("/sys/fs/cgroup/memory"));
    }

    #[test]
    fn explicit_and_none_choices() {
        let h = Hierarchies::from_texts(MOUNTINFO, SELF_CGROUP, "cpu");
        assert_eq!(h.v1.unwrap().id, 4);
        let h = Hierarchies::from_texts(MOUNTINFO, SELF_CGROUP, "name=systemd");
        assert_eq!(h.v1.unwrap().id, 1);
        assert!(Hierarchies::from_texts(MOUNTINFO, SELF_CGROUP, "none")
            .v1
            .is_none());
    }

    #[test]
    fn pure_v2_has_no_v1() {
        let mi = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let h = Hierarchies::from_texts(mi, "0::/init.scope\n", "auto");
        assert!(h.v1.is_none());
        assert_eq!(h.v2.unwrap().id, 0);
    }

    #[test]
    fn bind_mount_root_maps_paths() {
        let h = Hierarchies::from_texts(MOUNTINFO, SELF_CGROUP, "pids")
            .v1
            .unwrap();
        assert_eq!(
            h.dir_of("/kubepods/pod1/abc"),
            Some(PathBuf::from("/sys/fs/cgroup/pids/pod1/abc"))
        );
        assert_eq!(h.dir_of("/system.slice"), None);
    }

    #[test]
    fn registry_parses_once_and_forgets_removed() {
        let mut r = CgroupRegistry::default();
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        r.insert(0, 7, &format!("/docker/{id}"));
        let c = r.get(0, 7).unwrap().container.clone().unwrap();
        assert_eq!(c.container_id.as_deref(), Some(id));
        r.mark_removed(0, 7);
        r.gc(Duration::from_secs(60));
        assert!(r.contains(0, 7));
        r.gc(Duration::ZERO);
        assert!(!r.contains(0, 7));
    }

    #[test]
    fn a_pods_cgroups_share_its_uid() {
        let mut r = CgroupRegistry::default();
        let pod = |u: &str| format!("/kubepods.slice/kubepods-pod{u}.slice");
        let (a, b) = (
            "1b4e28ba_2fa1_11d2_883f_0016d3cca427",
            "2c5f39cb_3fb2_22e3_994f_1127e4ddb538",
        );
        let ctr = |u: &str, n: u8| {
            format!(
                "{}/cri-containerd-{}.scope",
                pod(u),
                format!("{n:x}").repeat(64)
            )
        };
        r.insert(0, 1, &pod(a));
        r.insert(0, 2, &ctr(a, 1));
        r.insert(0, 3, &ctr(a, 2));
        r.insert(0, 4, &ctr(b, 3));
        let uid = |id| {
            r.get(0, id)
                .unwrap()
                .container
                .clone()
                .unwrap()
                .pod_uid
                .clone()
                .unwrap()
        };
        assert_eq!(&*uid(2), "1b4e28ba-2fa1-11d2-883f-0016d3cca427");
        assert!(Arc::ptr_eq(&uid(1), &uid(2)) && Arc::ptr_eq(&uid(2), &uid(3)));
        assert_eq!(&*uid(4), "2c5f39cb-3fb2-22e3-994f-1127e4ddb538");
    }

    #[test]
    fn unescapes_mountinfo() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn a_cgroup_id_opens_its_path() {
        let h = Hierarchies::detect(Path::new("/proc"), "none");
        let Some(v2) = h.v2 else {
            return; // no cgroup2 mount: nothing to look up
        };
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let path = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        let Some(dir) = v2.dir_of(path) else {
            return; // our cgroup is outside this mount (a container's own namespace)
        };
        let id = std::fs::metadata(dir).unwrap().ino();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!(v2.path_of_id(id).as_deref(), Some(path));
        }
        assert_eq!(v2.path_of_id(u64::MAX - 7), None);
    }

    #[test]
    fn the_walk_reads_who_is_in_each_cgroup() {
        // A directory tree shaped like a cgroup2 mount: the walk only reads directories
        // and their cgroup.procs.
        let root = std::env::temp_dir().join(format!("cg-walk-{}", std::process::id()));
        let pod = root.join("kubepods.slice/kubepods-pod1.slice");
        let ctr = pod.join("cri-containerd-abc.scope");
        std::fs::create_dir_all(&ctr).unwrap();
        std::fs::write(root.join("cgroup.procs"), "1\n2\n").unwrap();
        std::fs::write(pod.join("cgroup.procs"), "").unwrap();
        std::fs::write(ctr.join("cgroup.procs"), "4242\n4243\n").unwrap();
        let h = Hierarchy {
            id: 0,
            name: "cgroup2".into(),
            mount_point: root.clone(),
            mount_root: "/".into(),
        };
        let mut reg = CgroupRegistry::default();
        let mut m = vec![];
        assert_eq!(reg.walk_members(&h, &mut m), 4);
        m.sort_unstable();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let (r, c) = (ino(&root), ino(&ctr));
        assert_eq!(m, vec![(1, r), (2, r), (4242, c), (4243, c)]);
        let node = reg.get(0, c).unwrap();
        assert_eq!(
            &*node.path,
            "/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope"
        );
        // The plain walk registers the same cgroups and reads no members.
        let mut plain = CgroupRegistry::default();
        assert_eq!(plain.walk(&h), 4);
        assert!(plain.contains(0, c));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
