//! Charts as inline SVG, drawn with plotters' SVG backend (no fonts or system libraries
//! needed; text is SVG text the browser renders).

use super::*;
use crate::schema::{phase_title, Report, BASELINE, DEVICE_DOWN, DEVICE_REBUILD, NOMINAL};
use plotters::coord::Shift;
use plotters::prelude::*;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error + 'static>>;

pub fn phase_color(p: &str) -> RGBColor {
    match p {
        BASELINE => RGBColor(120, 120, 120),
        NOMINAL => RGBColor(31, 119, 180),
        DEVICE_DOWN => RGBColor(214, 39, 40),
        DEVICE_REBUILD => RGBColor(240, 130, 20),
        _ => RGBColor(0, 0, 0),
    }
}

pub fn phase_css(p: &str) -> String {
    let c = phase_color(p);
    format!("rgb({},{},{})", c.0, c.1, c.2)
}

fn svg(w: u32, h: u32, draw: impl FnOnce(&Area) -> DrawResult) -> String {
    let mut buf = String::new();
    let r = {
        let root = SVGBackend::with_string(&mut buf, (w, h)).into_drawing_area();
        let r = root
            .fill(&WHITE)
            .map_err(|e| e.into())
            .and_then(|_| draw(&root));
        let r2 = root.present();
        r.and(r2.map_err(|e| e.into()))
    };
    match r {
        Ok(()) => buf,
        Err(e) => format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"40\"><text x=\"4\" y=\"20\">chart failed: {}</text></svg>",
            html_escape(&e.to_string())
        ),
    }
}

pub fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `n` bar slots. plotters' i32 ranges include their end, so 0..n would draw n+1 slots.
fn segments(
    n: usize,
) -> plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordi32> {
    (0..(n.max(1) as i32 - 1)).into_segmented()
}

fn short(p: &str) -> &'static str {
    match p {
        BASELINE => "baseline",
        NOMINAL => "nominal",
        DEVICE_DOWN => "dev. down",
        DEVICE_REBUILD => "rebuild",
        _ => "?",
    }
}

/// One workload through the life cycle: a bar per phase, ±1 stddev whiskers, value and
/// ratio to BASELINE on top.
pub fn lifecycle_bars(r: &Report, w: &Workload) -> String {
    let phases = measured_phases(r);
    let bars: Vec<(&str, f64, f64, Option<f64>)> = phases
        .iter()
        .filter_map(|p| {
            let c = r.cell(p, &w.id, w.iodepth)?;
            let (v, _) = headline(w, c);
            let cov = if by_bandwidth(w) {
                c.cov.bw_bytes
            } else {
                c.cov.iops
            };
            let ratio =
                c.vs_baseline
                    .as_ref()
                    .map(|x| if by_bandwidth(w) { x.bw_bytes } else { x.iops });
            Some((*p, v, v * cov, ratio))
        })
        .collect();
    let unit = if by_bandwidth(w) { "MB/s" } else { "IOPS" };
    let ymax = bars.iter().map(|b| b.1 + b.2).fold(0.0, f64::max).max(1e-9) * 1.22;
    svg(360, 250, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(&w.title, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(52)
            .build_cartesian_2d(segments(bars.len()), 0f64..ymax)?;
        let names: Vec<&str> = bars.iter().map(|b| short(b.0)).collect();
        let xf = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) => names.get(*i as usize).copied().unwrap_or("").into(),
            _ => String::new(),
        };
        let yf = |v: &f64| fmt_count(*v);
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(RGBColor(235, 235, 235))
            .y_desc(unit)
            .y_labels(5)
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .label_style(("sans-serif", 11))
            .draw()?;
        chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
            let mut rect = Rectangle::new(
                [
                    (SegmentValue::Exact(i as i32), 0.0),
                    (SegmentValue::Exact(i as i32 + 1), b.1),
                ],
                phase_color(b.0).filled(),
            );
            rect.set_margin(0, 0, 10, 10);
            rect
        }))?;
        chart.draw_series(
            bars.iter()
                .enumerate()
                .filter(|b| b.1 .2 > 0.0)
                .map(|(i, b)| {
                    PathElement::new(
                        vec![
                            (SegmentValue::CenterOf(i as i32), (b.1 - b.2).max(0.0)),
                            (SegmentValue::CenterOf(i as i32), b.1 + b.2),
                        ],
                        BLACK.stroke_width(1),
                    )
                }),
        )?;
        let style = TextStyle::from(("sans-serif", 11).into_font()).pos(
            plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Center,
                plotters::style::text_anchor::VPos::Bottom,
            ),
        );
        chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
            let label = match b.3 {
                Some(x) => format!("{} ({x:.2}x)", fmt_count(b.1)),
                None => fmt_count(b.1),
            };
            Text::new(
                label,
                (SegmentValue::CenterOf(i as i32), b.1 + b.2 + ymax * 0.01),
                style.clone(),
            )
        }))?;
        Ok(())
    })
}

/// Every workload's ratio to BASELINE, phase by phase, with a line at 1.0.
pub fn ratio_overview(r: &Report) -> String {
    let ws = main_workloads(r);
    let phases: Vec<&str> = measured_phases(r)
        .into_iter()
        .filter(|p| *p != BASELINE)
        .collect();
    let mut ymax: f64 = 1.2;
    for w in &ws {
        for p in &phases {
            if let Some(x) = r
                .cell(p, &w.id, w.iodepth)
                .and_then(|c| c.vs_baseline.as_ref())
            {
                ymax = ymax.max(if by_bandwidth(w) { x.bw_bytes } else { x.iops } * 1.4);
            }
        }
    }
    let width = (120 + ws.len() as u32 * 110).max(600);
    svg(width, 330, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                "Throughput relative to BASELINE (1.0 = the members without RAID)",
                ("sans-serif", 15),
            )
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(45)
            .build_cartesian_2d(segments(ws.len()), 0f64..ymax)?;
        let names: Vec<String> = ws.iter().map(|w| w.id.clone()).collect();
        let xf = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        };
        let yf = |v: &f64| format!("{v:.1}");
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(RGBColor(235, 235, 235))
            .x_labels(ws.len().max(1))
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .y_desc("ratio")
            .label_style(("sans-serif", 11))
            .draw()?;
        let np = phases.len().max(1) as f64;
        for (pi, p) in phases.iter().enumerate() {
            let color = phase_color(p);
            let rects: Vec<Rectangle<(SegmentValue<i32>, f64)>> = ws
                .iter()
                .enumerate()
                .filter_map(|(i, w)| {
                    let x = r.cell(p, &w.id, w.iodepth)?.vs_baseline.clone()?;
                    let v = if by_bandwidth(w) { x.bw_bytes } else { x.iops };
                    Some((i, v))
                })
                .map(|(i, v)| {
                    // Place bar pi of np inside the segment by pixel margins.
                    let seg = (width as f64 - 75.0) / ws.len().max(1) as f64;
                    let inner = seg * 0.8 / np;
                    let left = seg * 0.1 + inner * pi as f64;
                    let right = seg - left - inner;
                    let mut rect = Rectangle::new(
                        [
                            (SegmentValue::Exact(i as i32), 0.0),
                            (SegmentValue::Exact(i as i32 + 1), v),
                        ],
                        color.filled(),
                    );
                    rect.set_margin(0, 0, left.max(0.0) as u32, right.max(0.0) as u32);
                    rect
                })
                .collect();
            chart
                .draw_series(rects)?
                .label(phase_title(p))
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        chart.draw_series(std::iter::once(PathElement::new(
            vec![
                (SegmentValue::Exact(0), 1.0),
                (SegmentValue::Exact(ws.len() as i32), 1.0),
            ],
            BLACK.stroke_width(1),
        )))?;
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 12))
            .draw()?;
        Ok(())
    })
}

/// "Nines" scale: 0 = 0%, 1 = 90%, 2 = 99%, 3 = 99.9% ...
pub fn nines(p: f64) -> f64 {
    -(1.0 - p / 100.0).max(1e-9).log10()
}

fn nines_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-x));
    if p < 1.0 {
        "0%".into()
    } else if (p - p.round()).abs() < 0.01 {
        format!("{p:.0}%")
    } else {
        let s = format!("{p:.4}");
        format!("{}%", s.trim_end_matches('0').trim_end_matches('.'))
    }
}

/// Latency percentile curves of one workload (log latency over a nines scale), a line per
/// phase.
pub fn latency_curves(r: &Report, w: &Workload) -> String {
    let phases = measured_phases(r);
    let curves: Vec<(&str, Vec<(f64, f64)>)> = phases
        .iter()
        .filter_map(|p| {
            let c = r.cell(p, &w.id, w.iodepth)?;
            let pts: Vec<(f64, f64)> = c
                .mean
                .percentiles
                .iter()
                .filter(|x| x[1] > 0.0)
                .map(|x| (nines(x[0]), x[1]))
                .collect();
            (!pts.is_empty()).then_some((*p, pts))
        })
        .collect();
    let all: Vec<f64> = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|x| x.1))
        .collect();
    let lo = all.iter().copied().fold(f64::MAX, f64::min).max(1.0);
    let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
    let xmax = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|x| x.0))
        .fold(2.0, f64::max)
        .ceil();
    svg(420, 280, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!("{}: latency percentiles", w.title),
                ("sans-serif", 14),
            )
            .margin(8)
            .margin_right(28)
            .x_label_area_size(28)
            .y_label_area_size(58)
            .build_cartesian_2d(0f64..xmax, (lo / 1.5..hi * 1.5).log_scale())?;
        let xf = |v: &f64| nines_label(*v);
        let yf = |v: &f64| fmt_ns(*v);
        chart
            .configure_mesh()
            .light_line_style(RGBColor(235, 235, 235))
            .x_labels(xmax as usize + 1)
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .label_style(("sans-serif", 11))
            .draw()?;
        for (p, pts) in &curves {
            let color = phase_color(p);
            chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?;
            chart.draw_series(pts.iter().map(|pt| Circle::new(*pt, 2, color.filled())))?;
        }
        Ok(())
    })
}

/// Queue-depth sweep: IOPS (left chart) and p99 latency (right chart) over queue depth.
pub fn qd_curves(r: &Report, w: &Workload) -> String {
    let phases = measured_phases(r);
    // Per phase: (log2 QD, IOPS, p99 ns) points.
    type Points = Vec<(f64, f64, f64)>;
    let series: Vec<(&str, Points)> = phases
        .iter()
        .map(|p| {
            let pts = r
                .settings
                .qd_sweep
                .iter()
                .filter_map(|qd| {
                    let c = r.cell(p, &w.id, *qd)?;
                    Some(((*qd as f64).log2(), c.mean.iops, c.mean.lat_p99_ns))
                })
                .collect::<Vec<_>>();
            (*p, pts)
        })
        .filter(|s| !s.1.is_empty())
        .collect();
    let xmax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|x| x.0))
        .fold(1.0, f64::max);
    let imax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|x| x.1))
        .fold(1.0, f64::max)
        * 1.15;
    let lats: Vec<f64> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|x| x.2))
        .filter(|x| *x > 0.0)
        .collect();
    let llo = lats.iter().copied().fold(f64::MAX, f64::min).max(1.0);
    let lhi = lats.iter().copied().fold(0.0, f64::max).max(llo * 10.0);
    svg(860, 280, |root| {
        let (left, right) = root.split_horizontally(430);
        let xf = |v: &f64| format!("{}", 2f64.powf(*v).round());
        {
            let mut c = ChartBuilder::on(&left)
                .caption(format!("{}: IOPS", w.title), ("sans-serif", 14))
                .margin(8)
                .margin_right(20)
                .x_label_area_size(30)
                .y_label_area_size(55)
                .build_cartesian_2d(0f64..xmax, 0f64..imax)?;
            let yf = |v: &f64| fmt_count(*v);
            c.configure_mesh()
                .light_line_style(RGBColor(235, 235, 235))
                .x_labels(xmax as usize + 1)
                .x_label_formatter(&xf)
                .y_label_formatter(&yf)
                .x_desc("queue depth")
                .label_style(("sans-serif", 11))
                .draw()?;
            for (p, pts) in &series {
                let color = phase_color(p);
                c.draw_series(LineSeries::new(
                    pts.iter().map(|x| (x.0, x.1)),
                    color.stroke_width(2),
                ))?;
                c.draw_series(
                    pts.iter()
                        .map(|x| Circle::new((x.0, x.1), 3, color.filled())),
                )?;
            }
        }
        let mut c = ChartBuilder::on(&right)
            .caption(format!("{}: p99 latency", w.title), ("sans-serif", 14))
            .margin(8)
            .margin_right(28)
            .x_label_area_size(30)
            .y_label_area_size(58)
            .build_cartesian_2d(0f64..xmax, (llo / 1.5..lhi * 1.5).log_scale())?;
        let yf = |v: &f64| fmt_ns(*v);
        c.configure_mesh()
            .light_line_style(RGBColor(235, 235, 235))
            .x_labels(xmax as usize + 1)
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .x_desc("queue depth")
            .label_style(("sans-serif", 11))
            .draw()?;
        for (p, pts) in &series {
            let color = phase_color(p);
            c.draw_series(LineSeries::new(
                pts.iter().filter(|x| x.2 > 0.0).map(|x| (x.0, x.2)),
                color.stroke_width(2),
            ))?;
            c.draw_series(
                pts.iter()
                    .filter(|x| x.2 > 0.0)
                    .map(|x| Circle::new((x.0, x.2), 3, color.filled())),
            )?;
        }
        Ok(())
    })
}

/// Rebuild progress over time, with the end of the DEVICE REBUILD workloads marked.
pub fn rebuild_chart(r: &Report) -> Option<String> {
    let rb = r.rebuild.as_ref()?;
    if rb.samples.len() < 2 {
        return None;
    }
    let tmax = rb
        .samples
        .iter()
        .map(|s| s[0])
        .fold(1.0, f64::max)
        .max(rb.under_load_secs)
        * 1.05;
    Some(svg(560, 240, |root| {
        let mut c = ChartBuilder::on(root)
            .caption("Rebuild progress", ("sans-serif", 14))
            .margin(8)
            .margin_right(20)
            .x_label_area_size(30)
            .y_label_area_size(45)
            .build_cartesian_2d(0f64..tmax, 0f64..105f64)?;
        let yf = |v: &f64| format!("{v:.0}%");
        let xf = |v: &f64| format!("{v:.0}s");
        c.configure_mesh()
            .light_line_style(RGBColor(235, 235, 235))
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .x_desc("seconds since the rebuild started")
            .label_style(("sans-serif", 11))
            .draw()?;
        let color = phase_color(DEVICE_REBUILD);
        c.draw_series(LineSeries::new(
            rb.samples.iter().map(|s| (s[0], s[1])),
            color.stroke_width(2),
        ))?;
        c.draw_series(std::iter::once(PathElement::new(
            vec![(rb.under_load_secs, 0.0), (rb.under_load_secs, 105.0)],
            RGBColor(120, 120, 120).stroke_width(1),
        )))?
        .label("end of the workloads under rebuild")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], RGBColor(120, 120, 120)));
        c.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 11))
            .draw()?;
        Ok(())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_scale() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-9);
        assert_eq!(nines_label(0.0), "0%");
        assert_eq!(nines_label(2.0), "99%");
        assert_eq!(nines_label(3.0), "99.9%");
        assert_eq!(nines_label(4.0), "99.99%");
    }
}
