//! Means, coefficients of variation and ratios over the repetitions.

use crate::schema::{Cell, Cov, Metrics, Ratios, Run, BASELINE, NOMINAL};

pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Sample coefficient of variation (stddev with n-1 / mean); 0 for fewer than two samples or
/// a zero mean.
pub fn cov(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    if m == 0.0 {
        return 0.0;
    }
    let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64;
    var.sqrt() / m.abs()
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

pub fn ratios(a: &Metrics, b: &Metrics) -> Ratios {
    Ratios {
        iops: ratio(a.iops, b.iops),
        bw_bytes: ratio(a.bw_bytes, b.bw_bytes),
        lat_mean_ns: ratio(a.lat_mean_ns, b.lat_mean_ns),
        lat_p99_ns: ratio(a.lat_p99_ns, b.lat_p99_ns),
        iops_per_cpu_pct: ratio(a.iops_per_cpu_pct, b.iops_per_cpu_pct),
    }
}

/// Mean of every metric; percentile curves averaged point by point.
pub fn mean_metrics(ms: &[&Metrics]) -> Metrics {
    let f = |g: fn(&Metrics) -> f64| mean(&ms.iter().map(|m| g(m)).collect::<Vec<_>>());
    let mut pct: Vec<[f64; 2]> = Vec::new();
    if let Some(first) = ms.first() {
        for (i, p) in first.percentiles.iter().enumerate() {
            let vals: Vec<f64> = ms
                .iter()
                .filter_map(|m| m.percentiles.get(i))
                .filter(|x| x[0] == p[0])
                .map(|x| x[1])
                .collect();
            pct.push([p[0], mean(&vals)]);
        }
    }
    Metrics {
        iops: f(|m| m.iops),
        read_iops: f(|m| m.read_iops),
        write_iops: f(|m| m.write_iops),
        bw_bytes: f(|m| m.bw_bytes),
        lat_mean_ns: f(|m| m.lat_mean_ns),
        lat_p50_ns: f(|m| m.lat_p50_ns),
        lat_p99_ns: f(|m| m.lat_p99_ns),
        lat_p999_ns: f(|m| m.lat_p999_ns),
        server_cpu_pct: f(|m| m.server_cpu_pct),
        iops_per_cpu_pct: f(|m| m.iops_per_cpu_pct),
        bytes_per_cpu_sec: f(|m| m.bytes_per_cpu_sec),
        client_cpu_pct: f(|m| m.client_cpu_pct),
        percentiles: pct,
    }
}

/// Summarise runs into cells (in the order the cells were first measured) with ratios to
/// BASELINE and NOMINAL.
pub fn cells(runs: &[Run], cov_threshold: f64) -> Vec<Cell> {
    let mut keys: Vec<(String, String, u32)> = Vec::new();
    for r in runs {
        let k = (r.phase.clone(), r.workload.clone(), r.iodepth);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut out: Vec<Cell> = keys
        .into_iter()
        .map(|(phase, workload, iodepth)| {
            let rs: Vec<&Run> = runs
                .iter()
                .filter(|r| r.phase == phase && r.workload == workload && r.iodepth == iodepth)
                .collect();
            let ms: Vec<&Metrics> = rs.iter().map(|r| &r.metrics).collect();
            let col = |g: fn(&Metrics) -> f64| ms.iter().map(|m| g(m)).collect::<Vec<_>>();
            let c = Cov {
                iops: cov(&col(|m| m.iops)),
                bw_bytes: cov(&col(|m| m.bw_bytes)),
                lat_mean_ns: cov(&col(|m| m.lat_mean_ns)),
                lat_p99_ns: cov(&col(|m| m.lat_p99_ns)),
            };
            Cell {
                flagged: c.iops > cov_threshold,
                phase,
                workload,
                iodepth,
                n: rs.len() as u32,
                mean: mean_metrics(&ms),
                cov: c,
                vs_baseline: None,
                vs_nominal: None,
                ideal: None,
            }
        })
        .collect();
    let snapshot = out.clone();
    let find = |phase: &str, c: &Cell| {
        snapshot
            .iter()
            .find(|x| x.phase == phase && x.workload == c.workload && x.iodepth == c.iodepth)
            .map(|x| x.mean.clone())
    };
    for c in out.iter_mut() {
        if c.phase != BASELINE {
            c.vs_baseline = find(BASELINE, c).map(|b| ratios(&c.mean, &b));
        }
        if c.phase != BASELINE && c.phase != NOMINAL {
            c.vs_nominal = find(NOMINAL, c).map(|b| ratios(&c.mean, &b));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(phase: &str, rep: u32, iops: f64) -> Run {
        Run {
            phase: phase.into(),
            workload: "w".into(),
            iodepth: 32,
            connections: 1,
            rep,
            started_secs: 0.0,
            wall_secs: 1.0,
            metrics: Metrics {
                iops,
                lat_p99_ns: 1000.0 / iops,
                percentiles: vec![[50.0, iops], [99.0, 2.0 * iops]],
                ..Default::default()
            },
            rebuild_percent: None,
        }
    }

    #[test]
    fn cov_matches_hand_computation() {
        assert_eq!(cov(&[5.0]), 0.0);
        assert_eq!(cov(&[0.0, 0.0]), 0.0);
        // mean 10, sample stddev sqrt(((-2)^2 + 0 + 2^2) / 2) = 2
        assert!((cov(&[8.0, 10.0, 12.0]) - 0.2).abs() < 1e-12);
    }

    #[test]
    fn cells_flag_and_compare() {
        let runs = vec![
            run("baseline", 1, 100.0),
            run("baseline", 2, 100.0),
            run("nominal", 1, 40.0),
            run("nominal", 2, 60.0),
            run("device-down", 1, 25.0),
            run("device-down", 2, 25.0),
        ];
        let cs = cells(&runs, 0.1);
        assert_eq!(cs.len(), 3);
        let nom = &cs[1];
        assert_eq!(nom.n, 2);
        assert_eq!(nom.mean.iops, 50.0);
        assert!(nom.flagged, "COV {} should be flagged", nom.cov.iops);
        assert!(!cs[0].flagged);
        assert!((nom.vs_baseline.as_ref().unwrap().iops - 0.5).abs() < 1e-12);
        assert!(nom.vs_nominal.is_none());
        let down = &cs[2];
        assert!((down.vs_nominal.as_ref().unwrap().iops - 0.5).abs() < 1e-12);
        assert!((down.vs_baseline.as_ref().unwrap().iops - 0.25).abs() < 1e-12);
        assert_eq!(nom.mean.percentiles, vec![[50.0, 50.0], [99.0, 100.0]]);
        assert!(cs[0].vs_baseline.is_none());
    }
}
