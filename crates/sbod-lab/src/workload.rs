//! The field's fio workloads (shared/FIELD.md, "How they measure").

use crate::schema::Workload;

fn w(
    id: &str,
    title: &str,
    rw: &str,
    bs: Option<&str>,
    bssplit: Option<&str>,
    mix: Option<u32>,
    qd: u32,
) -> Workload {
    Workload {
        id: id.into(),
        title: title.into(),
        rw: rw.into(),
        bs: bs.map(Into::into),
        bssplit: bssplit.map(Into::into),
        rwmixread: mix,
        iodepth: qd,
        sweep: false,
    }
}

/// The mixed block-size job the field runs.
pub const BSSPLIT: &str = "4k/20:64k/50:256k/20:2M/10";

/// Every workload `sbod bench` knows, in report order.
pub fn catalogue() -> Vec<Workload> {
    vec![
        w(
            "randread-4k",
            "4K random read QD32",
            "randread",
            Some("4k"),
            None,
            None,
            32,
        ),
        w(
            "randwrite-4k",
            "4K random write QD32",
            "randwrite",
            Some("4k"),
            None,
            None,
            32,
        ),
        w(
            "randrw70-4k",
            "4K random 70/30 read/write QD32",
            "randrw",
            Some("4k"),
            None,
            Some(70),
            32,
        ),
        w(
            "seqread-128k",
            "128K sequential read QD16",
            "read",
            Some("128k"),
            None,
            None,
            16,
        ),
        w(
            "seqwrite-128k",
            "128K sequential write QD16",
            "write",
            Some("128k"),
            None,
            None,
            16,
        ),
        w(
            "seqread-1m",
            "1M sequential read QD16",
            "read",
            Some("1M"),
            None,
            None,
            16,
        ),
        w(
            "seqwrite-1m",
            "1M sequential write QD16",
            "write",
            Some("1M"),
            None,
            None,
            16,
        ),
        w(
            "mixed-bssplit",
            "Mixed 4K-2M random read/write QD16",
            "randrw",
            None,
            Some(BSSPLIT),
            Some(50),
            16,
        ),
        w(
            "qd1-randread-4k",
            "4K random read QD1 (latency)",
            "randread",
            Some("4k"),
            None,
            None,
            1,
        ),
        w(
            "qd1-randwrite-4k",
            "4K random write QD1 (latency)",
            "randwrite",
            Some("4k"),
            None,
            None,
            1,
        ),
    ]
}

/// Sweep workloads: measured at every queue depth of the sweep.
pub fn sweep_catalogue() -> Vec<Workload> {
    let mut r = w(
        "sweep-randread-4k",
        "4K random read, queue-depth sweep",
        "randread",
        Some("4k"),
        None,
        None,
        1,
    );
    r.sweep = true;
    let mut wr = w(
        "sweep-randwrite-4k",
        "4K random write, queue-depth sweep",
        "randwrite",
        Some("4k"),
        None,
        None,
        1,
    );
    wr.sweep = true;
    vec![r, wr]
}

/// The workloads of the demo's short suite.
pub const DEMO_SET: [&str; 7] = [
    "randread-4k",
    "randwrite-4k",
    "randrw70-4k",
    "seqread-1m",
    "seqwrite-1m",
    "mixed-bssplit",
    "qd1-randread-4k",
];

/// Look workloads up by id ("all" selects the whole catalogue).
pub fn select(ids: &[String]) -> anyhow::Result<Vec<Workload>> {
    let cat = catalogue();
    if ids.is_empty() || ids.iter().any(|i| i == "all") {
        return Ok(cat);
    }
    let mut out = Vec::new();
    for id in ids {
        match cat.iter().find(|w| &w.id == id) {
            Some(w) => {
                if !out.iter().any(|x: &Workload| x.id == w.id) {
                    out.push(w.clone())
                }
            }
            None => anyhow::bail!(
                "unknown workload '{id}'; known: {}",
                cat.iter()
                    .map(|w| w.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    Ok(out)
}

impl Workload {
    /// Does this workload write?
    pub fn writes(&self) -> bool {
        self.rw.contains("write") || self.rw.contains("rw")
    }

    /// fio options for this workload (everything but targets, sizes and timing).
    pub fn fio_args(&self, iodepth: u32) -> Vec<String> {
        let mut a = vec![format!("--rw={}", self.rw)];
        if let Some(bs) = &self.bs {
            a.push(format!("--bs={bs}"));
        }
        if let Some(s) = &self.bssplit {
            a.push(format!("--bssplit={s}"));
        }
        if let Some(m) = self.rwmixread {
            a.push(format!("--rwmixread={m}"));
        }
        a.push(format!("--iodepth={iodepth}"));
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_selectable() {
        let mut ids: Vec<String> = catalogue()
            .into_iter()
            .chain(sweep_catalogue())
            .map(|w| w.id)
            .collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n);
        let demo: Vec<String> = DEMO_SET.iter().map(|s| s.to_string()).collect();
        assert_eq!(select(&demo).unwrap().len(), DEMO_SET.len());
        assert!(select(&["nope".into()]).is_err());
        assert_eq!(select(&[]).unwrap().len(), catalogue().len());
    }

    #[test]
    fn writers_are_known() {
        let cat = catalogue();
        let writes: Vec<&str> = cat
            .iter()
            .filter(|w| w.writes())
            .map(|w| w.id.as_str())
            .collect();
        assert!(writes.contains(&"randrw70-4k"));
        assert!(writes.contains(&"mixed-bssplit"));
        assert!(!writes.contains(&"randread-4k"));
        assert!(!writes.contains(&"seqread-1m"));
        let mixed = cat.iter().find(|w| w.id == "mixed-bssplit").unwrap();
        assert!(mixed
            .fio_args(16)
            .contains(&"--bssplit=4k/20:64k/50:256k/20:2M/10".to_string()));
    }
}
