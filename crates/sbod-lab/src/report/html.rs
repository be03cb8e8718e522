//! The self-contained HTML report: inline CSS and SVG, nothing fetched from the network.

use super::charts::{self, html_escape as esc, phase_css};
use super::*;
use crate::schema::{phase_title, Report, BASELINE, NOMINAL};
use std::fmt::Write;

const CSS: &str = r#"
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px 32px; color: #222; max-width: 1500px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #555; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 4px 8px; }
th { background: #f4f4f4; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.grid { display: flex; flex-wrap: wrap; gap: 8px; }
.grid > div { border: 1px solid #eee; }
.legend span { display: inline-block; margin-right: 16px; font-size: 13px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
.warn { color: #b00; }
.ratio { color: #666; font-size: 12px; }
details { margin-top: 12px; }
"#;

fn legend(r: &Report) -> String {
    let mut s = String::from("<div class=\"legend\">");
    for p in measured_phases(r) {
        write!(
            s,
            "<span><i style=\"background:{}\"></i>{}</span>",
            phase_css(p),
            phase_title(p)
        )
        .unwrap();
    }
    s.push_str("</div>");
    s
}

fn summary_html(r: &Report) -> String {
    let phases = measured_phases(r);
    let lat_phase = if phases.contains(&NOMINAL) {
        NOMINAL
    } else {
        BASELINE
    };
    let mut s = String::from("<table><tr><th>workload</th>");
    for p in &phases {
        write!(s, "<th>{}</th>", phase_title(p)).unwrap();
    }
    writeln!(
        s,
        "<th>{0} mean / p99 / p99.9</th><th>{0} sbod CPU</th><th>{0} IOPS per CPU%</th></tr>",
        phase_title(lat_phase)
    )
    .unwrap();
    for w in main_workloads(r) {
        write!(s, "<tr><td>{}</td>", esc(&w.title)).unwrap();
        for p in &phases {
            match r.cell(p, &w.id, w.iodepth) {
                Some(c) => {
                    let (v, unit) = headline(w, c);
                    let ratio = c
                        .vs_baseline
                        .as_ref()
                        .map(|x| {
                            format!(
                                " <span class=\"ratio\">({:.2}x)</span>",
                                if by_bandwidth(w) { x.bw_bytes } else { x.iops }
                            )
                        })
                        .unwrap_or_default();
                    let flag = if c.flagged {
                        format!(
                            " <span class=\"warn\" title=\"COV {:.1}%\">⚠</span>",
                            c.cov.iops * 100.0
                        )
                    } else {
                        String::new()
                    };
                    write!(
                        s,
                        "<td class=\"n\">{} {unit}{ratio}{flag}</td>",
                        fmt_count(v)
                    )
                    .unwrap();
                }
                None => s.push_str("<td class=\"n\">-</td>"),
            }
        }
        match r.cell(lat_phase, &w.id, w.iodepth) {
            Some(c) => write!(
                s,
                "<td class=\"n\">{} / {} / {}</td><td class=\"n\">{:.0}%</td><td class=\"n\">{}</td>",
                fmt_ns(c.mean.lat_mean_ns),
                fmt_ns(c.mean.lat_p99_ns),
                fmt_ns(c.mean.lat_p999_ns),
                c.mean.server_cpu_pct,
                fmt_count(c.mean.iops_per_cpu_pct)
            )
            .unwrap(),
            None => s.push_str("<td></td><td></td><td></td>"),
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>");
    s
}

fn detail_table(r: &Report) -> String {
    let mut s = String::from(
        "<table><tr><th>phase</th><th>workload</th><th>QD</th><th>n</th><th>IOPS</th><th>MB/s</th><th>mean</th><th>p50</th><th>p99</th><th>p99.9</th><th>sbod CPU</th><th>IOPS/CPU%</th><th>fio CPU</th><th>COV IOPS</th><th>vs BASELINE</th><th>vs NOMINAL</th></tr>\n",
    );
    for c in &r.cells {
        write!(
            s,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.0}%</td><td class=\"n\">{}</td><td class=\"n\">{:.0}%</td><td class=\"n{}\">{:.1}%</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            phase_title(&c.phase),
            esc(&c.workload),
            c.iodepth,
            c.n,
            fmt_count(c.mean.iops),
            c.mean.bw_bytes / 1e6,
            fmt_ns(c.mean.lat_mean_ns),
            fmt_ns(c.mean.lat_p50_ns),
            fmt_ns(c.mean.lat_p99_ns),
            fmt_ns(c.mean.lat_p999_ns),
            c.mean.server_cpu_pct,
            fmt_count(c.mean.iops_per_cpu_pct),
            c.mean.client_cpu_pct,
            if c.flagged { " warn" } else { "" },
            c.cov.iops * 100.0,
            c.vs_baseline.as_ref().map(|x| format!("{:.2}x", x.iops)).unwrap_or("-".into()),
            c.vs_nominal.as_ref().map(|x| format!("{:.2}x", x.iops)).unwrap_or("-".into()),
        )
        .unwrap();
    }
    s.push_str("</table>");
    s
}

/// The whole page.
pub fn html(r: &Report) -> String {
    let mut s = String::new();
    writeln!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>sbod {}: {}</title><style>{CSS}</style></head><body>",
        esc(&r.mode),
        esc(&array_line(r))
    )
    .unwrap();
    writeln!(s, "<h1>sbod {}: {}</h1>", esc(&r.mode), esc(&array_line(r))).unwrap();
    writeln!(
        s,
        "<div class=\"sub\">{} &middot; {} &middot; {} CPUs, {} memory &middot; {} &middot; kernel {} &middot; {} &middot; sbod {}</div>",
        esc(&r.started),
        esc(&r.machine.cpu_model),
        r.machine.cpus,
        fmt_bytes(r.machine.memory_bytes as f64),
        esc(&r.machine.os),
        esc(&r.machine.kernel),
        esc(&r.tool.fio_version),
        esc(&r.tool.sbod_version)
    )
    .unwrap();
    writeln!(
        s,
        "<div class=\"sub\">{} repetitions of {:.1} s (+{:.1} s ramp) per measurement; precondition: {}; working set {}; COV threshold {:.0}%; run took {:.0} s.</div>",
        r.settings.repetitions,
        r.settings.runtime_secs,
        r.settings.ramp_secs,
        esc(&r.settings.precondition),
        fmt_bytes(r.settings.working_set_bytes as f64),
        r.settings.cov_threshold * 100.0,
        r.duration_secs
    )
    .unwrap();
    if r.incomplete {
        s.push_str("<p class=\"warn\"><b>The run did not finish: the numbers are partial.</b></p>");
    }
    s.push_str("<h2>Summary</h2>");
    s.push_str("<p class=\"sub\">Mean of the repetitions; in parentheses the ratio to BASELINE (the same members served one by one without RAID); ⚠ marks a coefficient of variation above the threshold.</p>");
    s.push_str(&summary_html(r));
    if let Some(l) = rebuild_line(r) {
        write!(s, "<p>{}.</p>", esc(&l)).unwrap();
    }
    let ideals = ideal_rows(r);
    if !ideals.is_empty() {
        s.push_str("<h2>Against the layout's ideal</h2><p class=\"sub\">The ratio to BASELINE the layout gives where the drives, not the CPU, are the limit (docs/LAB.md), the measured ratio, the fraction of the ideal it reaches and the fraction issue 31 aims for.</p>");
        s.push_str("<table><tr><th>workload</th><th>phase</th><th>measured</th><th>ideal</th><th>of ideal</th><th>aim</th><th>met</th></tr>\n");
        let f2 = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
        for i in &ideals {
            writeln!(
                s,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.2}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&i.workload.title),
                phase_title(i.phase),
                f2(i.measured),
                i.ideal,
                f2(i.of_ideal),
                f2(i.aim),
                i.met()
            )
            .unwrap();
        }
        s.push_str("</table>");
    }
    let phases = measured_phases(r);
    if phases.contains(&BASELINE) && phases.len() > 1 {
        s.push_str("<h2>Against the baseline</h2>");
        s.push_str(&charts::ratio_overview(r));
    }
    s.push_str("<h2>The life cycle, workload by workload</h2>");
    s.push_str(&legend(r));
    s.push_str("<p class=\"sub\">Bars: mean of the repetitions, whiskers &plusmn;1 standard deviation; label: value (ratio to BASELINE).</p><div class=\"grid\">");
    for w in main_workloads(r) {
        write!(s, "<div>{}</div>", charts::lifecycle_bars(r, w)).unwrap();
    }
    s.push_str("</div>");
    s.push_str("<h2>Latency percentiles</h2>");
    s.push_str(&legend(r));
    s.push_str("<p class=\"sub\">Completion latency (log scale) against the percentile on a &ldquo;nines&rdquo; scale: each step right is ten times rarer.</p><div class=\"grid\">");
    for w in main_workloads(r) {
        write!(s, "<div>{}</div>", charts::latency_curves(r, w)).unwrap();
    }
    s.push_str("</div>");
    let sweeps = sweep_workloads(r);
    if !sweeps.is_empty() {
        s.push_str("<h2>Queue-depth sweep</h2>");
        s.push_str(&legend(r));
        for w in sweeps {
            write!(s, "<div>{}</div>", charts::qd_curves(r, w)).unwrap();
        }
    }
    if let Some(c) = charts::rebuild_chart(r) {
        s.push_str("<h2>Rebuild</h2>");
        s.push_str(&c);
    }
    if !r.flags.is_empty() {
        s.push_str("<h2>High variation</h2><ul>");
        for f in &r.flags {
            write!(s, "<li class=\"warn\">{}</li>", esc(f)).unwrap();
        }
        s.push_str("</ul>");
    }
    if !r.notes.is_empty() {
        s.push_str("<h2>Notes</h2><ul>");
        for n in &r.notes {
            write!(s, "<li>{}</li>", esc(n)).unwrap();
        }
        s.push_str("</ul>");
    }
    s.push_str("<h2>All measurements</h2>");
    s.push_str(&detail_table(r));
    s.push_str("<details><summary>Array and members</summary><table><tr><th>slot</th><th>member</th><th>kind</th><th>size</th></tr>");
    for m in &r.array.members {
        write!(
            s,
            "<tr><td class=\"n\">{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
            m.slot,
            esc(&m.path),
            esc(&m.kind),
            fmt_bytes(m.size_bytes as f64)
        )
        .unwrap();
    }
    s.push_str("</table></details>");
    s.push_str("<p class=\"sub\">BASELINE serves each member alone through sbod (a one-member raid0 each) and runs the workload on all of them at once, with the same total queue depth as the RAID job: spread over min(QD, members) members, each at an equal share rounded up. Schema sbod-bench/1, documented in docs/LAB.md.</p>");
    s.push_str("</body></html>\n");
    s
}
