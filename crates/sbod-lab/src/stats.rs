//! Means, coefficients of variation and ratios over the repetitions.

use crate::schema::{Cell, Cov, Metrics, Ratios, Run, Workload, BASELINE, NOMINAL};

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

/// BASELINE's random writes this many times its random reads of the same size and depth,
/// on members that seek, were taken by the drives' write caches: a drive that seeks for a
/// read seeks for a write too, and reordering a full queue of writes gains 2-3x, not 10.
const CACHED_WRITES: f64 = 10.0;

/// Flags for BASELINE's random-write cells that the members' write caches took rather
/// than their platters (`seek`: every member is a disk that seeks, schema's
/// `MemberInfo::rotational`): a run shorter than the caches take to fill measures the
/// cache, and every ratio to that BASELINE compares the array with it (a modelled
/// `hdd-nearline` holds 32 MiB of writes: 8192 of 4 KiB).
pub fn cached_writes(seek: bool, workloads: &[Workload], cells: &[Cell]) -> Vec<String> {
    if !seek {
        return Vec::new();
    }
    let work = |id: &str| workloads.iter().find(|w| w.id == id);
    let mut out = Vec::new();
    for c in cells.iter().filter(|c| c.phase == BASELINE) {
        let Some(w) = work(&c.workload).filter(|w| w.rw == "randwrite") else {
            continue;
        };
        let read = cells.iter().find(|r| {
            r.phase == BASELINE
                && r.iodepth == c.iodepth
                && work(&r.workload).is_some_and(|x| x.rw == "randread" && x.bs == w.bs)
        });
        let Some(r) = read.filter(|r| r.mean.iops > 0.0) else {
            continue;
        };
        let times = c.mean.iops / r.mean.iops;
        if times > CACHED_WRITES {
            out.push(format!(
                "BASELINE {} qd{}: {:.0} IOPS, {times:.0}x its random reads ({:.0}) on disks that seek: the drives' write caches took the run, not the platters, and the ratios of this workload compare the array with a cache; run longer than the caches take to fill (--runtime), or with the write caches off (modelled drives: wce=off)",
                c.workload, c.iodepth, c.mean.iops, r.mean.iops
            ));
        }
    }
    out
}

/// Fewer I/Os than this in a run make its rate a count of rare events (good to about
/// `1/sqrt(n)` at best) rather than a rate to judge a layout by.
pub const FEW_IOS: f64 = 200.0;

/// The cells whose runs each completed fewer than [`FEW_IOS`] I/Os (IOPS times the
/// run's length), with that count: on slow drives a 3 s run of 4 KiB random writes holds
/// about 50, and its ratio is only as good as that (docs/PERFORMANCE.md: a declustered
/// layout's random writes at 0.74 of the planner's figure in 3 s runs, 1.17 in 20 s).
pub fn few_ios(runtime_secs: f64, cells: &[Cell]) -> Vec<(&Cell, f64)> {
    cells
        .iter()
        .filter_map(|c| {
            let n = c.mean.iops * runtime_secs;
            (c.mean.iops > 0.0 && n < FEW_IOS).then_some((c, n))
        })
        .collect()
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

    fn workload(id: &str, rw: &str) -> Workload {
        Workload {
            id: id.into(),
            title: id.into(),
            rw: rw.into(),
            bs: Some("4k".into()),
            bssplit: None,
            rwmixread: None,
            iodepth: 32,
            sweep: false,
        }
    }

    #[test]
    fn writes_a_cache_took_are_flagged_on_disks_that_seek() {
        let ws = [
            workload("randread-4k", "randread"),
            workload("randwrite-4k", "randwrite"),
        ];
        let with = |read: f64, write: f64| {
            let mut runs = vec![run("baseline", 1, read), run("baseline", 1, write)];
            runs[0].workload = "randread-4k".into();
            runs[1].workload = "randwrite-4k".into();
            cells(&runs, 0.1)
        };
        // The demo on 4 modelled HDDs with their caches on: 581 reads, 31215 writes.
        let cached = with(581.0, 31215.0);
        let f = cached_writes(true, &ws, &cached);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].contains("randwrite-4k qd32") && f[0].contains("54x"),
            "{f:?}"
        );
        // Not on members that do not seek (memory, SSDs), nor writes a drive's queue
        // reorders (2-3x), nor without a read of the same size to judge by.
        assert!(cached_writes(false, &ws, &cached).is_empty());
        assert!(cached_writes(true, &ws, &with(581.0, 1500.0)).is_empty());
        assert!(cached_writes(true, &ws[1..], &cached).is_empty());
    }

    #[test]
    fn runs_of_few_ios_are_named_with_their_count() {
        // 16 IOPS for 3 s (a declustered raid6's random writes on slow drives), 150 for 3 s.
        let cs = cells(&[run("nominal", 1, 16.0), run("baseline", 1, 150.0)], 0.1);
        let f = few_ios(3.0, &cs);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].0.phase, "nominal");
        assert!((f[0].1 - 48.0).abs() < 1e-9);
        // 20 s of the same: 320 I/Os, enough.
        assert!(few_ios(20.0, &cs).is_empty());
    }
}
