//! The cluster's history as gpu-agent's series (docs/metrics.md), written as OpenMetrics text
//! for `promtool tsdb create-blocks-from openmetrics`: one file per block's time range, each
//! series' samples in time order, timestamps in seconds, `# EOF` at the end.
//!
//! A scraped series ends with a staleness marker; a backfilled one cannot carry it, so an
//! instant query would see its last sample for the lookback (5 minutes) after it. Each
//! container's samples therefore stop one rule interval before its end: the rules see a
//! life [from, to) at exactly (to - from) / 5 m evaluations, whatever their phase.
use std::io::{self, Write};

use super::cluster::{Cluster, Container, Device, Workload, STEP};

/// The metric families, in the order written.
pub const FAMILIES: [&str; 4] = [
    "container_gpu_share",
    "container_gpu_sm_share",
    "container_gpu_memory_peak_bytes",
    "hw_gpu_memory_limit_bytes",
];

/// One series: its family (an index into `FAMILIES`), the line's text up to the timestamp,
/// and its first and last sample times (unix seconds).
#[derive(Debug, Clone)]
pub struct Series {
    pub family: usize,
    pub head: String,
    pub first: u64,
    pub last: u64,
}

/// Every series of the cluster, family by family.
pub fn series(c: &Cluster) -> Vec<Series> {
    let mut out = vec![];
    for w in &c.workloads {
        for k in &w.containers {
            for &(d, share) in &k.devices {
                container_series(w, k, &c.devices[d], share, &mut out);
            }
        }
    }
    for d in &c.devices {
        let labels = device_labels(d);
        out.push(Series {
            family: 3,
            head: format!("{}{{{labels}}} {} ", FAMILIES[3], d.memory()),
            first: c.start,
            last: c.end - STEP,
        });
    }
    out.sort_by_key(|s| s.family);
    out
}

fn container_series(w: &Workload, k: &Container, d: &Device, share: f64, out: &mut Vec<Series>) {
    let node = format!("node-{:03}", d.node);
    let labels = format!(
        "container_id=\"{}\",pod_uid=\"{}\",namespace=\"{}\",pod=\"{}\",container=\"{}\",\
         workload_kind=\"{}\",workload=\"{}\",qos=\"guaranteed\",runtime=\"containerd\",\
         hw_id=\"{}\",gpu_uuid=\"{}\",node=\"{node}\",owner=\"container\"",
        k.id,
        k.pod_uid,
        w.namespace,
        k.pod,
        k.name,
        w.class.kind,
        w.name,
        d.uuid,
        d.gpu_uuid(),
    );
    let held = match d.mig {
        Some(m) => format!(
            "{labels},model=\"{}\",mig_profile=\"{}\"",
            d.model.name, m.profile
        ),
        None => format!("{labels},model=\"{}\"", d.model.name),
    };
    let (first, last) = (k.from, k.to - STEP);
    let mut push = |family: usize, labels: &str, value: String| {
        out.push(Series {
            family,
            head: format!("{}{{{labels}}} {value} ", FAMILIES[family]),
            first,
            last,
        })
    };
    push(0, &held, share.to_string());
    if let Some(sm) = w.class.sm {
        push(1, &held, sm.to_string());
    }
    push(2, &labels, k.peak_bytes.to_string());
}

fn device_labels(d: &Device) -> String {
    let bus = format!("00000000:{:02X}:00.0", 0x18 + d.gpu * 0x10);
    let node = format!("node-{:03}", d.node);
    match (d.mig, &d.parent) {
        (Some(m), Some(parent)) => format!(
            "hw_id=\"{}\",gpu=\"{}\",model=\"{} MIG {}\",pci_bus_id=\"{bus}\",node=\"{node}\",hw_parent=\"{parent}\"",
            d.uuid, d.gpu, d.model.name, m.profile
        ),
        _ => format!(
            "hw_id=\"{}\",gpu=\"{}\",model=\"{}\",pci_bus_id=\"{bus}\",node=\"{node}\"",
            d.uuid, d.gpu, d.model.name
        ),
    }
}

/// Writes the samples in [from, to) of every series, every `scrape` seconds (a divisor of
/// `STEP`, so that each series' samples lie on multiples of it); returns how many.
pub fn write_range(
    w: &mut impl Write,
    series: &[Series],
    (from, to): (u64, u64),
    scrape: u64,
) -> io::Result<u64> {
    assert!(scrape > 0 && STEP.is_multiple_of(scrape));
    let mut n = 0;
    let mut family = usize::MAX;
    let mut ts = itoa_buf();
    for s in series {
        if s.family != family {
            family = s.family;
            writeln!(w, "# TYPE {} gauge", FAMILIES[family])?;
        }
        let mut t = s.first.max(from.next_multiple_of(scrape));
        while t <= s.last && t < to {
            w.write_all(s.head.as_bytes())?;
            w.write_all(itoa(&mut ts, t))?;
            n += 1;
            t += scrape;
        }
    }
    Ok(n)
}

/// The last line of an OpenMetrics file.
pub fn write_eof(w: &mut impl Write) -> io::Result<()> {
    w.write_all(b"# EOF\n")
}

fn itoa_buf() -> [u8; 24] {
    [0; 24]
}

/// `t` and a newline, in decimal, from a buffer of the caller's.
fn itoa(buf: &mut [u8; 24], mut t: u64) -> &[u8] {
    let mut i = buf.len() - 1;
    buf[i] = b'\n';
    loop {
        i -= 1;
        buf[i] = b'0' + (t % 10) as u8;
        t /= 10;
        if t == 0 {
            return &buf[i..];
        }
    }
}

/// The samples `series` has, every `scrape` seconds.
pub fn samples(series: &[Series], scrape: u64) -> u64 {
    (series.iter())
        .map(|s| (s.last - s.first) / scrape + 1)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rightsize_bench::cluster::DAY;

    const END: u64 = 1_800_000_000 - 1_800_000_000 % STEP;

    fn text(series: &[Series], range: (u64, u64), scrape: u64) -> (String, u64) {
        let mut v = vec![];
        let n = write_range(&mut v, series, range, scrape).unwrap();
        write_eof(&mut v).unwrap();
        (String::from_utf8(v).unwrap(), n)
    }

    #[test]
    fn samples_stop_one_interval_before_the_end_and_ranges_split_them() {
        let s = vec![Series {
            family: 0,
            head: "container_gpu_share{a=\"1\"} 0.25 ".into(),
            first: 600,
            last: 1200 - STEP,
        }];
        let (t, n) = text(&s, (0, 10_000), 60);
        assert_eq!(n, 6);
        assert!(t.starts_with(
            "# TYPE container_gpu_share gauge\ncontainer_gpu_share{a=\"1\"} 0.25 600\n"
        ));
        assert!(
            t.ends_with("container_gpu_share{a=\"1\"} 0.25 900\n# EOF\n"),
            "{t}"
        );
        // Two ranges hold each sample once.
        let (a, na) = text(&s, (0, 720), 60);
        let (b, nb) = text(&s, (720, 10_000), 60);
        assert_eq!((na, nb, samples(&s, 60)), (2, 4, 6));
        assert!(a.contains(" 660\n") && !a.contains(" 720\n") && b.contains(" 720\n"));
    }

    #[test]
    fn a_cluster_writes_its_families_in_order_with_the_agents_labels() {
        let c = Cluster::new(20, 2, END);
        let s = series(&c);
        let (t, n) = text(&s, (c.start, c.end), STEP);
        assert_eq!(n, samples(&s, STEP));
        let types: Vec<&str> = t.lines().filter(|l| l.starts_with("# TYPE")).collect();
        assert_eq!(types.len(), 4, "{types:?}");
        let mig = (t.lines())
            .find(|l| {
                l.starts_with("container_gpu_share{") && l.contains("mig_profile=\"3g.40gb\"")
            })
            .unwrap();
        assert!(mig.contains("model=\"NVIDIA H100 80GB HBM3\""), "{mig}");
        assert!(mig.contains(" 0.42857142857142855 "), "{mig}");
        let parent = (t.lines()).find(|l| l.contains("hw_parent=")).unwrap();
        assert!(parent.contains("MIG 1g.10gb") || parent.contains("MIG 3g.40gb"));
        // No SM series for the MIG devices without GPM (class `tok`).
        let of = |family: &str| {
            let prefix = format!("{family}{{");
            (t.lines())
                .filter(move |l| l.starts_with(&prefix) && l.contains("workload=\"tok-"))
                .count()
        };
        assert!(of("container_gpu_share") > 0);
        assert_eq!(of("container_gpu_sm_share"), 0);
        // Two days of a device every 5 minutes.
        let first = (t.lines())
            .find(|l| l.starts_with("hw_gpu_memory_limit_bytes"))
            .unwrap();
        let labels = first.rsplitn(3, ' ').nth(2).unwrap();
        let points = t.lines().filter(|l| l.starts_with(labels)).count() as u64;
        assert_eq!(points, 2 * DAY / STEP);
        assert_eq!(c.end - c.start, 2 * DAY);
    }
}
