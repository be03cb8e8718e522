//! The Markdown summary.

use super::*;
use crate::schema::{phase_title, Report, BASELINE, NOMINAL};
use std::fmt::Write;

fn cell_text(r: &Report, w: &Workload, phase: &str) -> String {
    let Some(c) = r.cell(phase, &w.id, w.iodepth) else {
        return "-".into();
    };
    let (v, unit) = headline(w, c);
    let mut s = format!("{} {unit}", fmt_count(v));
    if let Some(rt) = &c.vs_baseline {
        let x = if by_bandwidth(w) {
            rt.bw_bytes
        } else {
            rt.iops
        };
        write!(s, " ({x:.2})").unwrap();
    }
    if c.flagged {
        s.push_str(" ⚠");
    }
    s
}

/// The headline table: each workload through the life cycle, ratios to BASELINE in
/// parentheses, NOMINAL tail latency and efficiency.
pub fn summary_table(r: &Report) -> String {
    let phases = measured_phases(r);
    let mut s = String::new();
    write!(s, "| workload |").unwrap();
    for p in &phases {
        write!(s, " {} |", phase_title(p)).unwrap();
    }
    let lat_phase = if phases.contains(&NOMINAL) {
        NOMINAL
    } else {
        BASELINE
    };
    writeln!(
        s,
        " {} p99 | {} IOPS/CPU% |",
        phase_title(lat_phase),
        phase_title(lat_phase)
    )
    .unwrap();
    write!(s, "|---|").unwrap();
    for _ in &phases {
        write!(s, "---:|").unwrap();
    }
    writeln!(s, "---:|---:|").unwrap();
    for w in main_workloads(r) {
        write!(s, "| {} |", w.title).unwrap();
        for p in &phases {
            write!(s, " {} |", cell_text(r, w, p)).unwrap();
        }
        let c = r.cell(lat_phase, &w.id, w.iodepth);
        writeln!(
            s,
            " {} | {} |",
            c.map(|c| fmt_ns(c.mean.lat_p99_ns)).unwrap_or("-".into()),
            c.filter(|c| c.mean.iops_per_cpu_pct > 0.0)
                .map(|c| fmt_count(c.mean.iops_per_cpu_pct))
                .unwrap_or("-".into())
        )
        .unwrap();
    }
    s
}

/// The whole Markdown report.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    writeln!(s, "# sbod {}: {}\n", r.mode, array_line(r)).unwrap();
    writeln!(
        s,
        "{} on {} ({} CPUs, {} memory, kernel {}), {}; {} x {:.1} s per measurement (+{:.1} s ramp), precondition {}, working set {}.\n",
        r.started,
        if r.machine.cpu_model.is_empty() { "?" } else { &r.machine.cpu_model },
        r.machine.cpus,
        fmt_bytes(r.machine.memory_bytes as f64),
        r.machine.kernel,
        r.tool.fio_version,
        r.settings.repetitions,
        r.settings.runtime_secs,
        r.settings.ramp_secs,
        r.settings.precondition,
        fmt_bytes(r.settings.working_set_bytes as f64),
    )
    .unwrap();
    if r.incomplete {
        writeln!(
            s,
            "**The run did not finish: the numbers below are partial.**\n"
        )
        .unwrap();
    }
    writeln!(s, "## Summary\n").unwrap();
    writeln!(
        s,
        "Mean of the repetitions; in parentheses the ratio to BASELINE (the same members, no RAID); ⚠ marks a COV above {:.0}%.\n",
        r.settings.cov_threshold * 100.0
    )
    .unwrap();
    s.push_str(&summary_table(r));
    if let Some(l) = rebuild_line(r) {
        writeln!(s, "\n{l}.").unwrap();
    }
    let ideals = ideal_rows(r);
    if !ideals.is_empty() {
        writeln!(s, "\n## Against the layout's ideal\n").unwrap();
        writeln!(
            s,
            "The ratio to BASELINE the layout gives where the drives, not the CPU, are the limit (docs/LAB.md, \"The layout's ideal\"), the measured ratio, the fraction of the ideal it reaches, and the fraction issue 31 aims for.\n"
        )
        .unwrap();
        writeln!(
            s,
            "| workload | phase | measured | ideal | of ideal | aim | met |\n|---|---|---:|---:|---:|---:|---|"
        )
        .unwrap();
        let f2 = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
        for i in &ideals {
            writeln!(
                s,
                "| {} | {} | {} | {:.2} | {} | {} | {} |",
                i.workload.title,
                phase_title(i.phase),
                f2(i.measured),
                i.ideal,
                f2(i.of_ideal),
                f2(i.aim),
                i.met()
            )
            .unwrap();
        }
    }
    let phases = measured_phases(r);
    writeln!(s, "\n## Latency (mean / p99 / p99.9)\n").unwrap();
    write!(s, "| workload |").unwrap();
    for p in &phases {
        write!(s, " {} |", phase_title(p)).unwrap();
    }
    writeln!(s).unwrap();
    write!(s, "|---|").unwrap();
    for _ in &phases {
        write!(s, "---:|").unwrap();
    }
    writeln!(s).unwrap();
    for w in main_workloads(r) {
        write!(s, "| {} |", w.title).unwrap();
        for p in &phases {
            match r.cell(p, &w.id, w.iodepth) {
                Some(c) => write!(
                    s,
                    " {} / {} / {} |",
                    fmt_ns(c.mean.lat_mean_ns),
                    fmt_ns(c.mean.lat_p99_ns),
                    fmt_ns(c.mean.lat_p999_ns)
                )
                .unwrap(),
                None => write!(s, " - |").unwrap(),
            }
        }
        writeln!(s).unwrap();
    }
    writeln!(
        s,
        "\n## Efficiency (sbod server CPU usr+sys, IOPS per CPU%, GB per CPU-second)\n"
    )
    .unwrap();
    if let Some(f) = &r.floor {
        write!(
            s,
            "The floor on this machine (least CPU a written byte costs, client GB per CPU-second of one thread): one copy {:.2}, copy + crc32c {:.2}",
            f.copy / 1e9,
            f.copy_crc32c / 1e9
        )
        .unwrap();
        if let Some(l) = f.layout {
            write!(s, ", this layout {:.2} ({})", l / 1e9, f.what).unwrap();
        }
        writeln!(
            s,
            ". A write's GB per CPU-second over the floor (\"of floor\") is what the server keeps of it.\n"
        )
        .unwrap();
    }
    write!(s, "| workload |").unwrap();
    for p in &phases {
        write!(s, " {} |", phase_title(p)).unwrap();
    }
    writeln!(s).unwrap();
    write!(s, "|---|").unwrap();
    for _ in &phases {
        write!(s, "---:|").unwrap();
    }
    writeln!(s).unwrap();
    for w in main_workloads(r) {
        write!(s, "| {} |", w.title).unwrap();
        for p in &phases {
            match r.cell(p, &w.id, w.iodepth) {
                Some(c) => {
                    write!(
                        s,
                        " {:.0}% / {}",
                        c.mean.server_cpu_pct,
                        fmt_count(c.mean.iops_per_cpu_pct)
                    )
                    .unwrap();
                    if c.mean.bytes_per_cpu_sec > 0.0 {
                        write!(s, " / {:.2} GB/CPU-s", c.mean.bytes_per_cpu_sec / 1e9).unwrap();
                        // Writes against the floor of what every written byte costs:
                        // BASELINE's members alone keep no checksums and no parity.
                        let floor = r.floor.as_ref().map(|f| match *p == BASELINE {
                            true => f.copy,
                            false => f.layout.unwrap_or(f.copy_crc32c),
                        });
                        if let (Some(fl), true) =
                            (floor, matches!(w.rw.as_str(), "write" | "randwrite"))
                        {
                            write!(s, " ({:.2} of floor)", c.mean.bytes_per_cpu_sec / fl).unwrap();
                        }
                    }
                    write!(s, " |").unwrap();
                }
                None => write!(s, " - |").unwrap(),
            }
        }
        writeln!(s).unwrap();
    }
    for w in sweep_workloads(r) {
        writeln!(s, "\n## {}\n", w.title).unwrap();
        write!(s, "| QD |").unwrap();
        for p in &phases {
            write!(s, " {} IOPS | {} p99 |", phase_title(p), phase_title(p)).unwrap();
        }
        writeln!(s).unwrap();
        write!(s, "|---:|").unwrap();
        for _ in &phases {
            write!(s, "---:|---:|").unwrap();
        }
        writeln!(s).unwrap();
        for qd in &r.settings.qd_sweep {
            write!(s, "| {qd} |").unwrap();
            for p in &phases {
                match r.cell(p, &w.id, *qd) {
                    Some(c) => write!(
                        s,
                        " {} | {} |",
                        fmt_count(c.mean.iops),
                        fmt_ns(c.mean.lat_p99_ns)
                    )
                    .unwrap(),
                    None => write!(s, " - | - |").unwrap(),
                }
            }
            writeln!(s).unwrap();
        }
    }
    if !r.flags.is_empty() {
        writeln!(s, "\n## High variation\n").unwrap();
        for f in &r.flags {
            writeln!(s, "- {f}").unwrap();
        }
    }
    if !r.notes.is_empty() {
        writeln!(s, "\n## Notes\n").unwrap();
        for n in &r.notes {
            writeln!(s, "- {n}").unwrap();
        }
    }
    writeln!(
        s,
        "\nBASELINE serves each member alone through sbod (one-member raid0) and runs the workload on all of them at once, with the same total queue depth as the RAID job: spread over min(QD, members) members, each at an equal share rounded up. See docs/LAB.md."
    )
    .unwrap();
    s
}
