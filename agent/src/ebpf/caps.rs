//! Which capabilities the eBPF mode needs, and which of them this process lacks.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

fn effective() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Names of the missing capabilities, empty when eBPF can be tried. CAP_SYS_ADMIN alone
/// suffices (and older kernels need it); otherwise CAP_BPF and CAP_PERFMON both.
pub fn missing_for_ebpf() -> Vec<&'static str> {
    let Some(eff) = effective() else {
        return vec![];
    };
    let has = |c: u32| eff & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) {
        return vec![];
    }
    let mut missing = vec![];
    if !has(CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    missing
}
