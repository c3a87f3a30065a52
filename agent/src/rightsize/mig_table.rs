//! The MIG profiles of the GPUs that have them, for a GPU model this node cannot ask NVML
//! about. Profile names and compute slices: NVIDIA's MIG User Guide, "Supported MIG
//! Profiles" (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html),
//! and the GPU Operator's mig-parted configuration for GH200 144GB. Only the plain profiles:
//! a `+me` variant has the same slices and memory as its plain profile.
//!
//! Memory, MiB: the driver's figure (NVML's `memorySizeMB`, as `nvidia-smi mig -lgip`
//! shows it) where it is known: A30 and A100 (NVIDIA's go-nvml mocks,
//! pkg/nvml/mock/shared/gpus, which match published `-lgip` output), H100 80GB (published
//! `-lgip` output) and H200 (`-lgip` on an H200, driver 580.159.04). Elsewhere 7/8 of the
//! size in the profile's name: the name rounds up, and every driver figure known is above
//! 7/8 of it (the lowest, H200 1g.18gb, is 16 GiB of 18). A workload the table fits in a
//! profile fits; it may fit a smaller one than the table says.
//!
//! Placements, in memory slices (8 on a 7-slice GPU, 4 on the A30): where a profile's GPU
//! instance may start, and how many slices it takes, as `nvidia-smi mig -lgipp` prints them
//! and the MIG User Guide's placement diagrams ("Supported MIG Profiles") draw them. Every
//! 7-slice GPU shares one layout: the smallest 1g at any of 0-6, the 1g with two memory
//! slices at 0, 2, 4 or 6, 2g at 0, 2 or 4, 3g at 0 or 4 (four slices each), 4g at 0 (four),
//! 7g at 0 (eight). The A30: 1g at 0-3, 2g at 0 or 2, 4g at 0.

/// Where a profile's instances may start and how many memory slices each takes.
pub type Shape = (&'static [u32], u32);

const P1: Shape = (&[0, 1, 2, 3, 4, 5, 6], 1);
const P1_WIDE: Shape = (&[0, 2, 4, 6], 2);
const P2: Shape = (&[0, 2, 4], 2);
const P3: Shape = (&[0, 4], 4);
const P4: Shape = (&[0], 4);
const P7: Shape = (&[0], 8);

/// One table profile: name, compute slices, memory MiB, placements.
pub type TableProfile = (&'static str, u32, u64, Shape);

/// One GPU model's profiles.
pub struct TableModel {
    pub name: &'static str,
    pub total_slices: u32,
    /// Memory slices of the whole GPU: what placements count in.
    pub memory_slices: u32,
    pub profiles: &'static [TableProfile],
}

/// 7/8 of `gib` GiB, in MiB.
const fn est(gib: u64) -> u64 {
    gib * 1024 * 7 / 8
}

pub const TABLE: &[TableModel] = &[
    TableModel {
        name: "A30 24GB",
        total_slices: 4,
        memory_slices: 4,
        profiles: &[
            ("1g.6gb", 1, 5836, (&[0, 1, 2, 3], 1)),
            ("2g.12gb", 2, 11672, (&[0, 2], 2)),
            ("4g.24gb", 4, 23344, (&[0], 4)),
        ],
    },
    TableModel {
        name: "A100 40GB",
        total_slices: 7,
        memory_slices: 8,
        profiles: &[
            ("1g.5gb", 1, 4864, P1),
            ("1g.10gb", 1, 9856, P1_WIDE),
            ("2g.10gb", 2, 9856, P2),
            ("3g.20gb", 3, 19968, P3),
            ("4g.20gb", 4, 19968, P4),
            ("7g.40gb", 7, 40192, P7),
        ],
    },
    TableModel {
        name: "A100 80GB",
        total_slices: 7,
        memory_slices: 8,
        profiles: &[
            ("1g.10gb", 1, 9856, P1),
            ("1g.20gb", 1, 19968, P1_WIDE),
            ("2g.20gb", 2, 19968, P2),
            ("3g.40gb", 3, 40192, P3),
            ("4g.40gb", 4, 40192, P4),
            ("7g.80gb", 7, 80384, P7),
        ],
    },
    TableModel {
        name: "H100 80GB",
        total_slices: 7,
        memory_slices: 8,
        profiles: &[
            ("1g.10gb", 1, 9984, P1),
            ("1g.20gb", 1, 20096, P1_WIDE),
            ("2g.20gb", 2, 20096, P2),
            ("3g.40gb", 3, 40448, P3),
            ("4g.40gb", 4, 40448, P4),
            ("7g.80gb", 7, 81152, P7),
        ],
    },
    TableModel {
        name: "H100 94GB",
        total_slices: 7,
        memory_slices: 8,
        profiles: &[
            ("1g.12gb", 1, est(12), P1),
            ("1g.24gb", 1, est(24), P1_WIDE),
            ("2g.24gb", 2, est(24), P2),
            ("3g.47gb", 3, est(47), P3),
            ("4g.47gb", 4, est(47), P4),
            ("7g.94gb", 7, est(94), P7),
        ],
    },
    TableModel {
        name: "H200 141GB",
        total_slices: 7,
        memory_slices: 8,
        profiles: &[
            ("1g.18gb", 1, 16384, P1),
            ("1g.35gb", 1, 33280, P1_WIDE),
            ("2g.35gb", 2, 33280, P2),
            ("3g.71gb", 3, 71424, P3),
            ("4g.71gb", 4, 71424, P4),
            ("7g.141gb", 7, 143360, P7),
        ],
    },
    TableModel {
        name: "GH200 96GB",
        total_slices: 7,
        memory_slices: 8,
        profiles: &[
            ("1g.12gb", 1, est(12), P1),
            ("1g.24gb", 1, est(24), P1_WIDE),
            ("2g.24gb", 2, est(24), P2),
            ("3g.48gb", 3, est(48), P3),
            ("4g.48gb", 4, est(48), P4),
            ("7g.96gb", 7, est(96), P7),
        ],
    },
    TableModel {
        name: "GH200 144GB",
        total_slices: 7,
        memory_slices: 8,
        profiles: &[
            ("1g.18gb", 1, est(18), P1),
            ("1g.36gb", 1, est(36), P1_WIDE),
            ("2g.36gb", 2, est(36), P2),
            ("3g.72gb", 3, est(72), P3),
            ("4g.72gb", 4, est(72), P4),
            ("7g.144gb", 7, est(144), P7),
        ],
    },
    TableModel {
        name: "B200 180GB",
        total_slices: 7,
        memory_slices: 8,
        profiles: &[
            ("1g.23gb", 1, est(23), P1),
            ("1g.45gb", 1, est(45), P1_WIDE),
            ("2g.45gb", 2, est(45), P2),
            ("3g.90gb", 3, est(90), P3),
            ("4g.90gb", 4, est(90), P4),
            ("7g.180gb", 7, est(180), P7),
        ],
    },
];

const GIB: f64 = (1u64 << 30) as f64;

/// The table's entry for a GPU as NVML names it ("NVIDIA H100 80GB HBM3", "NVIDIA A100
/// 80GB PCIe", "NVIDIA GH200 480GB", ...), its size told by the name where the name says
/// it, else by its memory (bytes). None: not a GPU the table knows.
pub fn lookup(model: &str, memory_bytes: Option<u64>) -> Option<&'static TableModel> {
    let n = model.to_ascii_lowercase();
    let has = |s: &str| n.contains(s);
    let gib = memory_bytes.map_or(0.0, |b| b as f64 / GIB);
    let name = if has("gh200") {
        // "NVIDIA GH200 480GB" is the 96GB part (480GB is the CPU's memory).
        match has("144g") || gib > 110.0 {
            true => "GH200 144GB",
            false => "GH200 96GB",
        }
    } else if has("gb200") {
        return None;
    } else if has("a30") {
        "A30 24GB"
    } else if has("a100") {
        match has("80gb") || (!has("40gb") && gib > 60.0) {
            true => "A100 80GB",
            false => "A100 40GB",
        }
    } else if has("h100") {
        match has("nvl") || has("94gb") || (!has("80gb") && gib > 85.0) {
            true => "H100 94GB",
            false => "H100 80GB",
        }
    } else if has("h200") {
        "H200 141GB"
    } else if has("b200") {
        "B200 180GB"
    } else {
        return None;
    };
    TABLE.iter().find(|m| m.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;

    #[test]
    fn nvml_names_find_their_entry() {
        let cases = [
            ("NVIDIA A100-SXM4-80GB", None, "A100 80GB"),
            ("NVIDIA A100 80GB PCIe", None, "A100 80GB"),
            ("NVIDIA A100-SXM4-40GB", Some(40 * GB), "A100 40GB"),
            ("NVIDIA A100-PCIE-40GB", None, "A100 40GB"),
            ("NVIDIA H100 80GB HBM3", Some(85_520_809_984), "H100 80GB"),
            ("NVIDIA H100 PCIe", Some(80 * GB), "H100 80GB"),
            ("NVIDIA H100 NVL", Some(94 * GB), "H100 94GB"),
            ("NVIDIA H100", Some(94 * GB), "H100 94GB"),
            ("NVIDIA H200", Some(150_754_820_096), "H200 141GB"),
            ("NVIDIA GH200 480GB", Some(96 * GB), "GH200 96GB"),
            ("NVIDIA GH200 144G HBM3e", None, "GH200 144GB"),
            ("NVIDIA B200", Some(180 * GB), "B200 180GB"),
            ("NVIDIA A30", Some(24 * GB), "A30 24GB"),
        ];
        for (model, mem, want) in cases {
            let got = lookup(model, mem).map(|m| m.name);
            assert_eq!(got, Some(want), "{model}");
        }
        for other in ["NVIDIA L4", "NVIDIA A10G", "Tesla T4", "NVIDIA GB200", ""] {
            assert!(lookup(other, Some(24 * GB)).is_none(), "{other}");
        }
        // A MIG device's own memory does not shrink a GPU its name sizes.
        let a100 = lookup("NVIDIA A100-SXM4-80GB", Some(10 * GB));
        assert_eq!(a100.map(|m| m.name), Some("A100 80GB"));
    }

    #[test]
    fn every_entry_is_ordered_and_ends_with_the_whole_gpu() {
        for m in TABLE {
            let last = m.profiles.last().unwrap();
            assert_eq!(last.1, m.total_slices, "{}", m.name);
            assert_eq!(last.3 .1, m.memory_slices, "{}: the whole GPU", m.name);
            for w in m.profiles.windows(2) {
                assert!((w[0].1, w[0].2) <= (w[1].1, w[1].2), "{}: {w:?}", m.name);
            }
            for (name, slices, mib, (starts, size)) in m.profiles {
                // Each placement lies inside the GPU's memory slices.
                for s in *starts {
                    assert!(s + size <= m.memory_slices, "{name}: {s}+{size}");
                }
                // The name starts with its compute slices and ends with its size in GB.
                let (g, gb) = name.split_once("g.").unwrap();
                assert_eq!(g.parse::<u32>().unwrap(), *slices, "{name}");
                let gb: u64 = gb.trim_end_matches("gb").parse().unwrap();
                assert!(
                    *mib <= gb * 1024 && *mib >= gb * 1024 * 7 / 8,
                    "{name}: {mib}"
                );
            }
        }
    }
}
