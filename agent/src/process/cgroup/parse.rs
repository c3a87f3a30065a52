//! Cgroup path -> container / pod attribution.
//!
//! Pure, std-only, allocation-free until the result is built. Paths are split on
//! '/' and every component is classified on its own (plus its parent's name for
//! cgroupfs layouts). The deepest match wins, because nested setups (kind nodes,
//! docker-in-docker, rootless user managers) put the real workload below the
//! outer runtime's cgroup.
//!
//! Decisions worth knowing:
//! - Container ids must be exactly 64 *lowercase* hex chars. Runtimes only ever
//!   emit lowercase, and being strict keeps arbitrary unit names from matching.
//! - Pod uids must be 8-4-4-4-12 lowercase hex, with '-' (cgroupfs) or '_'
//!   (systemd) separators used consistently; output is always dashed.
//! - conmon cgroups (`crio-conmon-`, `libpod-conmon-`) are not containers; they
//!   do not match at all, so the result is whatever matched above them (the pod
//!   for CRI-O, nothing for a top-level podman conmon).
//! - A pod matched deeper than a container drops that container (kind node ->
//!   pod); a container matched below a pod keeps the pod (it runs inside it).

use gpu_model::Name;
use serde::Serialize;

/// What a cgroup path attributes its processes to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ContainerRef {
    /// Full 64 lowercase hex id, or None (pod-level cgroup, conmon, ...).
    pub container_id: Option<Name>,
    /// Dashed 8-4-4-4-12 lowercase form, or None.
    pub pod_uid: Option<Name>,
    pub qos: Option<Qos>,
    pub runtime: Option<Runtime>,
}

/// Kubernetes pod QoS class, as encoded in the kubelet's cgroup layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// Container runtime, when the cgroup name says which one made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Containerd,
    #[serde(rename = "cri-o")]
    Crio,
    Docker,
    Podman,
}

impl Qos {
    /// Same string as the serde form.
    pub fn as_str(&self) -> &'static str {
        match self {
            Qos::Guaranteed => "guaranteed",
            Qos::Burstable => "burstable",
            Qos::BestEffort => "besteffort",
        }
    }
}

impl Runtime {
    /// Same string as the serde form.
    pub fn as_str(&self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "cri-o",
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
        }
    }
}

const ID_LEN: usize = 64;
const UID_LEN: usize = 36;

/// Prefixes of container scopes / directories. `libpod-payload-` (podman
/// `--cgroups=split`, quadlet) must come before `libpod-`.
const PREFIXES: &[(&str, Runtime)] = &[
    ("cri-containerd-", Runtime::Containerd),
    ("crio-", Runtime::Crio),
    ("docker-", Runtime::Docker),
    ("libpod-payload-", Runtime::Podman),
    ("libpod-", Runtime::Podman),
    ("nerdctl-", Runtime::Containerd),
];

/// Middle field of the systemd `slice:prefix:name` form that runc/containerd
/// leave verbatim in some cgroup v1 setups.
const COLON_PREFIXES: &[(&str, Runtime)] = &[
    ("cri-containerd", Runtime::Containerd),
    ("crio", Runtime::Crio),
    ("docker", Runtime::Docker),
    ("libpod", Runtime::Podman),
];

type Pod<'a> = (&'a str, Option<Qos>);
type Ctr<'a> = (&'a str, Option<Runtime>);

enum Match<'a> {
    Pod(Pod<'a>),
    Container(Ctr<'a>),
    Both(Pod<'a>, Ctr<'a>),
}

/// Parses a cgroup path (as found in /proc/PID/cgroup or the cgroup tracepoints: relative to the
/// hierarchy root, starting with '/'). Returns None when the path is neither in a container nor in a pod.
pub fn parse_cgroup_path(path: &str) -> Option<ContainerRef> {
    let mut pod: Option<Pod> = None;
    let mut ctr: Option<Ctr> = None;
    let mut parent = "";
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        match classify(comp, parent) {
            Some(Match::Pod(p)) => {
                pod = Some(p);
                ctr = None;
            }
            Some(Match::Container(c)) => ctr = Some(c),
            Some(Match::Both(p, c)) => {
                pod = Some(p);
                ctr = Some(c);
            }
            None => {}
        }
        parent = comp;
    }
    if pod.is_none() && ctr.is_none() {
        return None;
    }
    Some(ContainerRef {
        container_id: ctr.map(|(id, _)| id.into()),
        // Validated: separators are all '-' or all '_'.
        pod_uid: pod.map(|(uid, _)| uid.replace('_', "-").into()),
        qos: pod.and_then(|(_, q)| q),
        runtime: ctr.and_then(|(_, r)| r),
    })
}

fn classify<'a>(comp: &'a str, parent: &str) -> Option<Match<'a>> {
    if is_id(comp) {
        // Bare id: only cgroupfs docker says who made it; kubelet cgroupfs
        // cannot tell containerd from docker.
        let rt = (parent == "docker").then_some(Runtime::Docker);
        return Some(Match::Container((comp, rt)));
    }
    if let Some(uid) = comp.strip_prefix("pod") {
        if is_uid(uid, b'-') {
            let qos = match parent {
                "kubepods" => Some(Qos::Guaranteed),
                "burstable" => Some(Qos::Burstable),
                "besteffort" => Some(Qos::BestEffort),
                _ => None,
            };
            return Some(Match::Pod((uid, qos)));
        }
    }
    if let Some(stem) = comp.strip_suffix(".slice") {
        return systemd_pod(stem).map(Match::Pod);
    }
    if comp.contains(':') {
        return colon_form(comp);
    }
    let stem = comp.strip_suffix(".scope").unwrap_or(comp);
    PREFIXES.iter().find_map(|&(prefix, rt)| {
        let id = stem.strip_prefix(prefix)?;
        is_id(id).then_some(Match::Container((id, Some(rt))))
    })
}

/// `[<prefix>-]kubepods[-burstable|-besteffort]-pod<uid_>` (the `.slice` already
/// stripped). The prefix covers kind's nested kubelet (`kubelet-kubepods-...`).
fn systemd_pod(stem: &str) -> Option<Pod<'_>> {
    let split = stem.len().checked_sub(UID_LEN)?;
    let uid = stem.get(split..)?;
    if !is_uid(uid, b'_') {
        return None;
    }
    let head = stem.get(..split)?.strip_suffix("-pod")?;
    let (head, qos) = if let Some(h) = head.strip_suffix("-burstable") {
        (h, Qos::Burstable)
    } else if let Some(h) = head.strip_suffix("-besteffort") {
        (h, Qos::BestEffort)
    } else {
        (head, Qos::Guaranteed)
    };
    let ok = match head.strip_suffix("kubepods") {
        Some(rest) => rest.is_empty() || rest.ends_with('-'),
        None => false,
    };
    ok.then_some((uid, Some(qos)))
}

/// `kubepods-...-pod<uid_>.slice:cri-containerd:<id>` (cgroup v1, systemd
/// driver, path taken verbatim from the OCI spec's `slice:prefix:name`).
fn colon_form(comp: &str) -> Option<Match<'_>> {
    let mut parts = comp.split(':');
    let (slice, prefix, id) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !is_id(id) {
        return None;
    }
    let rt = COLON_PREFIXES
        .iter()
        .find_map(|&(p, rt)| (p == prefix).then_some(rt))?;
    let ctr = (id, Some(rt));
    match slice.strip_suffix(".slice").and_then(systemd_pod) {
        Some(pod) => Some(Match::Both(pod, ctr)),
        None => Some(Match::Container(ctr)),
    }
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

fn is_id(s: &str) -> bool {
    s.len() == ID_LEN && s.bytes().all(is_lower_hex)
}

/// 8-4-4-4-12 lowercase hex with `sep` at the four separator positions.
fn is_uid(s: &str, sep: u8) -> bool {
    s.len() == UID_LEN
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == sep,
            _ => is_lower_hex(b),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID_A: &str = "ce82d94d69e1fbbc7feeb66930c69e9b96d9f151f594773e5d0e342741d15437";
    const ID_B: &str = "99f3a16ea25b7724cb56a4f0c0df1113ad9474fbf5545bead97fd5c7f61c13f4";
    const NODE: &str = "fd9d0ea06257a9780827cbc7fd92e3812a54fca26d63e191b73610d5d48b9cbd";

    fn r(
        id: Option<&str>,
        uid: Option<&str>,
        qos: Option<Qos>,
        rt: Option<Runtime>,
    ) -> Option<ContainerRef> {
        Some(ContainerRef {
            container_id: id.map(Into::into),
            pod_uid: uid.map(Into::into),
            qos,
            runtime: rt,
        })
    }

    fn table() -> Vec<(String, Option<ContainerRef>)> {
        use Qos::*;
        use Runtime::*;
        let uid = "f6adb0af-0855-4bab-b25b-c853f18d0ce2";
        let uid_ = "f6adb0af_0855_4bab_b25b_c853f18d0ce2";
        let kind_uid = "eab5a334-93fe-48a8-b139-9e8079c1f163";
        let kind_uid_ = "eab5a334_93fe_48a8_b139_9e8079c1f163";
        let kind_pod = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/\
             kubelet-kubepods-besteffort-pod{kind_uid_}.slice"
        );
        vec![
            // kubelet, cgroupfs driver
            (
                format!("/kubepods/burstable/pod{uid}/{ID_A}"),
                r(Some(ID_A), Some(uid), Some(Burstable), None),
            ),
            (
                format!("/kubepods/besteffort/pod{uid}/{ID_A}"),
                r(Some(ID_A), Some(uid), Some(BestEffort), None),
            ),
            (
                format!("/kubepods/pod{uid}/{ID_A}"),
                r(Some(ID_A), Some(uid), Some(Guaranteed), None),
            ),
            (
                format!("/kubepods/burstable/pod{uid}"),
                r(None, Some(uid), Some(Burstable), None),
            ),
            (
                format!("/kubepods/burstable/pod{uid}/crio-{ID_A}"),
                r(Some(ID_A), Some(uid), Some(Burstable), Some(Crio)),
            ),
            (
                format!("/kubepods/burstable/pod{uid}/crio-conmon-{ID_A}"),
                r(None, Some(uid), Some(Burstable), None),
            ),
            ("/kubepods".into(), None),
            ("/kubepods/burstable".into(), None),
            // Kepler test data: kubelet with a custom cgroup root, no leading '/'.
            (
                "kubelet/kubepods/besteffort/podbdd4097d-6795-404e-9bd8-6a1383386198/\
                 c79788e0da15a6597263eb2b9c51d05dd1a9a1d08c53c1161dc8c45d2dac6b38"
                    .into(),
                r(
                    Some("c79788e0da15a6597263eb2b9c51d05dd1a9a1d08c53c1161dc8c45d2dac6b38"),
                    Some("bdd4097d-6795-404e-9bd8-6a1383386198"),
                    Some(BestEffort),
                    None,
                ),
            ),
            // kubelet, systemd driver
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/\
                     cri-containerd-{ID_A}.scope"
                ),
                r(Some(ID_A), Some(uid), Some(Burstable), Some(Containerd)),
            ),
            (
                "/kubepods.slice/kubepods-burstable.slice/\
                 kubepods-burstable-podd0511cd2_29d2_4215_be0f_f77bc0609d99.slice/\
                 crio-f93ee491b8ed2680d5a909eb098b14a9430173b57ca1c4efedd8768566d67e8e.scope"
                    .into(),
                r(
                    Some("f93ee491b8ed2680d5a909eb098b14a9430173b57ca1c4efedd8768566d67e8e"),
                    Some("d0511cd2-29d2-4215-be0f-f77bc0609d99"),
                    Some(Burstable),
                    Some(Crio),
                ),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/\
                     crio-conmon-{ID_A}.scope"
                ),
                r(None, Some(uid), Some(Burstable), None),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/\
                     docker-{ID_A}.scope"
                ),
                r(Some(ID_A), Some(uid), Some(BestEffort), Some(Docker)),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{uid_}.slice/cri-containerd-{ID_A}.scope"),
                r(Some(ID_A), Some(uid), Some(Guaranteed), Some(Containerd)),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{uid_}.slice"),
                r(None, Some(uid), Some(Guaranteed), None),
            ),
            ("/kubepods.slice/kubepods-besteffort.slice".into(), None),
            // cgroup v1 systemd `slice:prefix:id` (Kepler test data).
            (
                "/system.slice/containerd.service/\
                 kubepods-besteffort-pod0043435f_1854_4327_b76b_730f681a781d.slice:cri-containerd:\
                 01fd96f7ad292b02a8317cde4ecb8c7ef3cc06ffdd113f13410e0837eb2b2a20"
                    .into(),
                r(
                    Some("01fd96f7ad292b02a8317cde4ecb8c7ef3cc06ffdd113f13410e0837eb2b2a20"),
                    Some("0043435f-1854-4327-b76b-730f681a781d"),
                    Some(BestEffort),
                    Some(Containerd),
                ),
            ),
            // kind / nested kubelet: the inner pod container wins over the node.
            (
                format!("{kind_pod}/cri-containerd-{ID_B}.scope"),
                r(
                    Some(ID_B),
                    Some(kind_uid),
                    Some(BestEffort),
                    Some(Containerd),
                ),
            ),
            (
                format!("/system.slice/docker-{NODE}.scope{kind_pod}/cri-containerd-{ID_B}.scope"),
                r(
                    Some(ID_B),
                    Some(kind_uid),
                    Some(BestEffort),
                    Some(Containerd),
                ),
            ),
            (
                format!("/system.slice/docker-{NODE}.scope{kind_pod}"),
                r(None, Some(kind_uid), Some(BestEffort), None),
            ),
            (
                format!("/system.slice/docker-{NODE}.scope/kubelet.slice/kubelet-kubepods.slice"),
                r(Some(NODE), None, None, Some(Docker)),
            ),
            (
                format!("/docker/{NODE}/kubepods/burstable/pod{uid}/{ID_B}"),
                r(Some(ID_B), Some(uid), Some(Burstable), None),
            ),
            // rootless
            (
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/kubepods.slice/\
                     kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/\
                     cri-containerd-{ID_A}.scope"
                ),
                r(Some(ID_A), Some(uid), Some(Burstable), Some(Containerd)),
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/user.slice/\
                 libpod-3f05ee050f82c0145f1d88c94269c39dff0f07dbf8bba20aafd54b3a75dcaecc.scope/\
                 container"
                    .into(),
                r(
                    Some("3f05ee050f82c0145f1d88c94269c39dff0f07dbf8bba20aafd54b3a75dcaecc"),
                    None,
                    None,
                    Some(Podman),
                ),
            ),
            (
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID_A}.scope"
                ),
                r(Some(ID_A), None, None, Some(Podman)),
            ),
            // plain docker
            (
                format!("/docker/{ID_A}"),
                r(Some(ID_A), None, None, Some(Docker)),
            ),
            (
                format!("/docker-{ID_A}"),
                r(Some(ID_A), None, None, Some(Docker)),
            ),
            (
                format!("/system.slice/docker-{ID_A}.scope"),
                r(Some(ID_A), None, None, Some(Docker)),
            ),
            (
                format!("/system.slice/docker-{ID_A}.scope/init.scope"),
                r(Some(ID_A), None, None, Some(Docker)),
            ),
            (
                format!("/docker/{NODE}/docker/{ID_A}"),
                r(Some(ID_A), None, None, Some(Docker)),
            ),
            // podman
            (
                format!("/machine.slice/libpod-{ID_A}.scope"),
                r(Some(ID_A), None, None, Some(Podman)),
            ),
            (
                format!("/machine.slice/libpod-{ID_A}.scope/container"),
                r(Some(ID_A), None, None, Some(Podman)),
            ),
            (format!("/machine.slice/libpod-conmon-{ID_A}.scope"), None),
            (
                format!("/libpod_parent/libpod-{ID_A}"),
                r(Some(ID_A), None, None, Some(Podman)),
            ),
            (
                format!("/machine.slice/machine-libpod_pod_{NODE}.slice/libpod-{ID_A}.scope"),
                r(Some(ID_A), None, None, Some(Podman)),
            ),
            (
                format!("/system.slice/kepler.service/libpod-payload-{ID_A}"),
                r(Some(ID_A), None, None, Some(Podman)),
            ),
            // containerd without kubernetes
            (
                format!("/system.slice/nerdctl-{ID_A}.scope"),
                r(Some(ID_A), None, None, Some(Containerd)),
            ),
            (format!("/default/{ID_A}"), r(Some(ID_A), None, None, None)),
            // cgroup v1 hierarchy-relative path behaves the same
            (
                format!("/system.slice/docker-{ID_A}.scope/"),
                r(Some(ID_A), None, None, Some(Docker)),
            ),
            // Whole /proc/PID/cgroup lines work too: "0::" matches nothing.
            (
                format!("0::/system.slice/docker-{ID_A}.scope"),
                r(Some(ID_A), None, None, Some(Docker)),
            ),
            // not containers
            ("/".into(), None),
            ("".into(), None),
            ("/user.slice/user-1000.slice/session-3.scope".into(), None),
            ("/system.slice/containerd.service".into(), None),
            ("/system.slice/kubelet.service".into(), None),
            ("/system.slice/docker.service".into(), None),
            ("/init.scope".into(), None),
            ("/system.slice/docker-xyz.scope".into(), None),
            (format!("/docker/{}", &ID_A[..63]), None),
            (format!("/docker/{ID_A}0"), None),
            (
                format!("/system.slice/docker-{}.scope", ID_A.to_uppercase()),
                None,
            ),
            // invalid uid: no pod (the container below still matches)
            (
                format!("/kubepods/burstable/pod{}/{ID_A}", &uid[..35]),
                r(Some(ID_A), None, None, None),
            ),
            (format!("/kubepods/burstable/pod{uid_}"), None),
            (format!("/kubepods.slice/kubepods-pod{uid}.slice"), None),
            (format!("/kubepods.slice/notkubepods-pod{uid_}.slice"), None),
        ]
    }

    #[test]
    fn table_cases() {
        let cases = table();
        assert!(cases.len() >= 30);
        for (path, want) in cases {
            assert_eq!(parse_cgroup_path(&path), want, "path: {path}");
        }
    }

    #[test]
    fn pod_level_has_no_container() {
        let uid = "2c9f8a79-5391-454b-88cb-86190881cb96";
        let got = parse_cgroup_path(
            "/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod2c9f8a79_5391_454b_88cb_86190881cb96.slice",
        )
        .unwrap();
        assert_eq!(got.pod_uid.as_deref(), Some(uid));
        assert_eq!(got.container_id, None);
        assert_eq!(got.runtime, None);
        assert_eq!(got.qos, Some(Qos::Burstable));
    }

    #[test]
    fn deepest_match_wins() {
        let p = format!("/docker/{NODE}/docker/{ID_B}/init.scope");
        assert_eq!(
            parse_cgroup_path(&p).unwrap().container_id.as_deref(),
            Some(ID_B)
        );
        // Pod inside a kind node drops the node container.
        let p = format!(
            "/system.slice/docker-{NODE}.scope/kubelet.slice/kubelet-kubepods.slice/\
             kubelet-kubepods-pod2c9f8a79_5391_454b_88cb_86190881cb96.slice"
        );
        let got = parse_cgroup_path(&p).unwrap();
        assert_eq!(got.container_id, None);
        assert_eq!(got.qos, Some(Qos::Guaranteed));
        // Kubelet inside a pod: the inner pod wins.
        let p = format!(
            "/kubepods/burstable/pod2c9f8a79-5391-454b-88cb-86190881cb96/{NODE}/\
             kubepods/besteffort/podeab5a334-93fe-48a8-b139-9e8079c1f163/{ID_B}"
        );
        let got = parse_cgroup_path(&p).unwrap();
        assert_eq!(
            got.pod_uid.as_deref(),
            Some("eab5a334-93fe-48a8-b139-9e8079c1f163")
        );
        assert_eq!(got.container_id.as_deref(), Some(ID_B));
        assert_eq!(got.qos, Some(Qos::BestEffort));
    }

    #[test]
    fn as_str_names() {
        assert_eq!(Qos::BestEffort.as_str(), "besteffort");
        assert_eq!(Qos::Guaranteed.as_str(), "guaranteed");
        assert_eq!(Runtime::Crio.as_str(), "cri-o");
        assert_eq!(Runtime::Containerd.as_str(), "containerd");
    }

    fn check_invariants(r: &ContainerRef) {
        assert!(r.container_id.is_some() || r.pod_uid.is_some());
        if let Some(id) = &r.container_id {
            assert!(is_id(id), "{id}");
        }
        if let Some(uid) = &r.pod_uid {
            assert!(is_uid(uid, b'-'), "{uid}");
        }
        if r.container_id.is_none() {
            assert_eq!(r.runtime, None);
        }
        if r.pod_uid.is_none() {
            assert_eq!(r.qos, None);
        }
    }

    #[test]
    fn garbage_does_not_panic() {
        // xorshift64*: deterministic, no extra crates.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        const TOKENS: &[&str] = &[
            "/",
            "kubepods",
            ".slice",
            ".scope",
            "-pod",
            "pod",
            "_",
            "-",
            ":",
            "cri-containerd-",
            "crio-",
            "docker",
            "libpod-",
            "burstable",
            "besteffort",
            "f6adb0af-0855-4bab-b25b-c853f18d0ce2",
            "f6adb0af_0855_4bab_b25b_c853f18d0ce2",
            ID_A,
            "é",
            "\u{1F600}",
            "\0",
        ];
        let mut buf = Vec::new();
        for _ in 0..20_000 {
            buf.clear();
            let n = next() % 48;
            for _ in 0..n {
                let x = next();
                if x % 3 == 0 {
                    buf.push((x >> 8) as u8);
                } else {
                    let t = TOKENS[(x >> 8) as usize % TOKENS.len()];
                    buf.extend_from_slice(t.as_bytes());
                }
            }
            let s = String::from_utf8_lossy(&buf);
            if let Some(r) = parse_cgroup_path(&s) {
                check_invariants(&r);
            }
        }
    }

    #[test]
    fn long_inputs_do_not_panic() {
        let deep = format!("/docker-{ID_A}.scope").repeat(20_000);
        let got = parse_cgroup_path(&deep).unwrap();
        assert_eq!(got.container_id.as_deref(), Some(ID_A));
        let junk = "ab\u{00e9}/".repeat(100_000);
        assert_eq!(parse_cgroup_path(&junk), None);
        let one = "f".repeat(1 << 20);
        assert_eq!(parse_cgroup_path(&one), None);
        let slashes = "/".repeat(1 << 20);
        assert_eq!(parse_cgroup_path(&slashes), None);
    }
}
