//! Reports: the Markdown summary and the self-contained HTML page with its charts.

mod charts;
mod html;
mod markdown;

pub use html::html;
pub use markdown::{markdown, summary_table};

use crate::schema::{Cell, Report, Workload, PHASES};

/// Latency in human units.
pub fn fmt_ns(ns: f64) -> String {
    if ns <= 0.0 {
        "-".into()
    } else if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.0} µs", ns / 1e3)
    } else if ns < 1e7 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns < 1e8 {
        format!("{:.1} ms", ns / 1e6)
    } else if ns < 1e9 {
        format!("{:.0} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Bytes in binary units.
pub fn fmt_bytes(b: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} {}", units[i])
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// A count with k/M suffixes.
pub fn fmt_count(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e4 {
        format!("{:.1}k", x / 1e3)
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// Does the workload read better in MB/s than in IOPS (large blocks)?
pub fn by_bandwidth(w: &Workload) -> bool {
    w.bssplit.is_some()
        || w.bs
            .as_deref()
            .is_some_and(|b| !matches!(b.to_ascii_lowercase().as_str(), "4k" | "8k" | "512"))
}

/// The headline number of a cell: IOPS, or MB/s for large-block workloads.
pub fn headline(w: &Workload, c: &Cell) -> (f64, &'static str) {
    if by_bandwidth(w) {
        (c.mean.bw_bytes / 1e6, "MB/s")
    } else {
        (c.mean.iops, "IOPS")
    }
}

/// Phases that were measured, in life-cycle order.
pub fn measured_phases(r: &Report) -> Vec<&'static str> {
    PHASES
        .iter()
        .copied()
        .filter(|p| r.cells.iter().any(|c| c.phase == *p))
        .collect()
}

/// The main (non-sweep) workloads that have at least one cell.
pub fn main_workloads(r: &Report) -> Vec<&Workload> {
    r.workloads
        .iter()
        .filter(|w| !w.sweep && r.cells.iter().any(|c| c.workload == w.id))
        .collect()
}

pub fn sweep_workloads(r: &Report) -> Vec<&Workload> {
    r.workloads
        .iter()
        .filter(|w| w.sweep && r.cells.iter().any(|c| c.workload == w.id))
        .collect()
}

/// One row of the "against the layout's ideal" table.
pub struct IdealRow<'a> {
    pub workload: &'a Workload,
    pub phase: &'a str,
    /// Measured ratio to BASELINE (IOPS; for one block size the same as bandwidth).
    pub measured: Option<f64>,
    pub ideal: f64,
    pub of_ideal: Option<f64>,
    pub aim: Option<f64>,
}

impl IdealRow<'_> {
    /// "yes", "no" or "" (no aim, or nothing measured against BASELINE).
    pub fn met(&self) -> &'static str {
        match (self.of_ideal, self.aim) {
            (Some(f), Some(a)) if f >= a => "yes",
            (Some(_), Some(_)) => "no",
            _ => "",
        }
    }
}

/// The cells that have a layout ideal, workload by workload in life-cycle order.
pub fn ideal_rows(r: &Report) -> Vec<IdealRow<'_>> {
    let mut out = Vec::new();
    for w in main_workloads(r) {
        for p in PHASES {
            let Some(c) = r.cell(p, &w.id, w.iodepth) else {
                continue;
            };
            let Some(i) = &c.ideal else { continue };
            out.push(IdealRow {
                workload: w,
                phase: p,
                measured: c.vs_baseline.as_ref().map(|x| x.iops),
                ideal: i.ratio,
                of_ideal: i.of_ideal,
                aim: i.aim,
            });
        }
    }
    out
}

/// A one-line description of the array.
pub fn array_line(r: &Report) -> String {
    let a = &r.array;
    let each = a.members.first().map(|m| m.size_bytes).unwrap_or(0);
    let kind = a.members.first().map(|m| m.kind.as_str()).unwrap_or("?");
    let groups = if a.groups > 1 && a.level != "raid10" {
        format!(" in {} groups", a.groups)
    } else {
        String::new()
    };
    format!(
        "{} of {} x {} {kind} members{groups}, chunk {}, {} usable",
        a.level,
        a.members.len(),
        fmt_bytes(each as f64),
        fmt_bytes(a.chunk_bytes as f64),
        fmt_bytes(a.size_bytes as f64)
    )
}

/// The rebuild in one sentence.
pub fn rebuild_line(r: &Report) -> Option<String> {
    let rb = r.rebuild.as_ref()?;
    Some(match (rb.duration_secs, rb.rate_bytes_per_sec) {
        (Some(d), Some(rate)) => format!(
            "Rebuild of {} ({}): {:.1} s at {}/s{}{}",
            fmt_bytes(rb.bytes as f64),
            if rb.replacement == rb.failed_member {
                "the failed member, wiped and rebuilt in place".to_string()
            } else {
                format!("onto {}", rb.replacement)
            },
            d,
            fmt_bytes(rate),
            format_args!(
                ", {:.1} s of it under the DEVICE REBUILD workloads",
                rb.under_load_secs
            ),
            match r.settings.rebuild_rate_limit {
                Some(l) => format!(" (rate limited to {}/s)", fmt_bytes(l as f64)),
                None => String::new(),
            }
        ),
        _ => format!(
            "Rebuild of {} did not finish during the run",
            fmt_bytes(rb.bytes as f64)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(fmt_ns(0.0), "-");
        assert_eq!(fmt_ns(850.0), "850 ns");
        assert_eq!(fmt_ns(153_000.0), "153 µs");
        assert_eq!(fmt_ns(2_500_000.0), "2.50 ms");
        assert_eq!(fmt_bytes(1073741824.0), "1.0 GiB");
        assert_eq!(fmt_count(36409.0), "36.4k");
        assert_eq!(fmt_count(1_234_567.0), "1.23M");
    }
}
