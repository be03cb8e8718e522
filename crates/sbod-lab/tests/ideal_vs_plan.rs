//! The lab's "layout's ideal" (crates/sbod-lab/src/ideal.rs) and the planner's performance
//! estimate (crates/sbod-plan/src/performance.rs) are one model written twice: drive
//! operations per client I/O, and for one disk down the degraded group pacing the others.
//! Over a grid of layouts, phases and workloads the planner's figure divided by the disk
//! count must be the ratio to BASELINE the lab calls ideal; the rows the planner cannot
//! express are named. What the engine measures against them on modelled drives is in
//! docs/PERFORMANCE.md ("The engine against the layout's ideal").

use sbod_lab::ideal::ideal;
use sbod_lab::schema::{ArrayInfo, MemberInfo, Workload};
use sbod_plan::{Layout, LayoutSpec, Performance};

fn array(l: &Layout) -> ArrayInfo {
    // Both spell levels as sbod does (raid6, ec:K+M); mirrors carry their copies as width
    // and their mirror sets as groups, as `sbod status` reports them.
    let level = l.level.to_string();
    let width = match l.copies {
        Some(c) => c,
        None => l.group_width,
    };
    let groups = match l.copies {
        Some(c) => l.members / c,
        None => l.groups,
    };
    ArrayInfo {
        name: l.spec.clone(),
        level,
        chunk_bytes: 65536,
        groups,
        width,
        redundancy: l.set_tolerates,
        declustered: l.declustered,
        size_bytes: 0,
        members: (0..l.disks)
            .map(|i| MemberInfo {
                slot: i,
                path: format!("m{i}"),
                size_bytes: 1,
                kind: "model".into(),
            })
            .collect(),
    }
}

fn workload(rw: &str) -> Workload {
    Workload {
        id: rw.into(),
        title: rw.into(),
        rw: rw.into(),
        bs: Some(if rw.starts_with("rand") { "4k" } else { "1M" }.into()),
        bssplit: None,
        rwmixread: None,
        iodepth: 16,
        sweep: false,
    }
}

#[test]
fn the_planner_predicts_the_lab_ideal_over_a_grid_of_layouts() {
    let grid = [
        ("raid5:1x8", 8),
        ("raid6:1x8", 8),
        ("ec:5+3:1x8", 8),
        ("ec:4+2:2x6:s2", 14),
        ("raid6:3x8", 24),
        ("raid6:1x7:s1:d", 8),
        ("raid6:2x10:s4:d", 24),
        ("raid10:4x2", 8),
        ("raid10:1x6:c3", 6),
        ("raid0:1x8", 8),
    ];
    let mut compared = 0;
    let mut cannot = Vec::new();
    let mut streams = Vec::new();
    for (spec, disks) in grid {
        let s: LayoutSpec = spec.parse().unwrap();
        let l = Layout::resolve(&s, disks).unwrap();
        let p = Performance::estimate(&l, None, None);
        let a = array(&l);
        let n = l.disks as f64;
        for (phase, figs) in [
            (
                "nominal",
                Some((p.seq_read, p.seq_write, p.rand_read, p.rand_write)),
            ),
            (
                "device-down",
                p.degraded
                    .as_ref()
                    .map(|d| (d.seq_read, d.seq_write, d.rand_read, d.rand_write)),
            ),
        ] {
            for (rw, i) in [("read", 0), ("write", 1), ("randread", 2), ("randwrite", 3)] {
                let lab = ideal(&a, &workload(rw), phase, None).map(|x| x.ratio);
                let plan = figs.map(|f| [f.0, f.1, f.2, f.3][i].disks / n);
                // The planner's mirrors read sequentially from every copy at once (many
                // streams, as the field measures them: docs/PLANNER.md); the lab's one
                // stream takes each chunk from one copy, so each disk passes the others'.
                if l.copies.is_some() && rw == "read" {
                    let (lab, plan) = (lab.unwrap(), plan.unwrap());
                    assert!(plan >= lab - 1e-9, "{spec} {phase}: {plan} < {lab}");
                    streams.push(format!("{spec} {phase}"));
                    continue;
                }
                match (lab, plan) {
                    (Some(lab), Some(plan)) => {
                        assert!(
                            (lab - plan).abs() < 1e-9,
                            "{spec} {phase} {rw}: lab ideal {lab:.3}, planner {plan:.3}"
                        );
                        compared += 1;
                    }
                    (None, None) => cannot.push(format!("{spec} {phase} {rw}")),
                    (lab, plan) => panic!("{spec} {phase} {rw}: lab {lab:?}, planner {plan:?}"),
                }
            }
        }
    }
    // raid0 has no DEVICE DOWN in either.
    assert_eq!(cannot.len(), 4, "{cannot:?}");
    assert_eq!(streams.len(), 4, "{streams:?}");
    assert!(compared >= 66, "{compared}");
}
