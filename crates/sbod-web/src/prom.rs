//! `GET /metrics`: the arrays in Prometheus' text format (OpenMetrics), named in the spirit
//! of the node exporter's md collector (`node_md_state{device,state}`,
//! `node_md_disks{state}`...): state gauges are 1 for the current state and 0 for the others,
//! so alerts read `sbod_array_state{state="degraded"} == 1`.
//!
//! The values come from status and metrics snapshots taken for each scrape; the
//! prometheus-client crate's encoder writes them ([`Collector`]).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use sbod_types::control::IoMetrics;
use sbod_types::{ArrayState, ArrayStatus, MemberState, MemberStatus};

/// One scrape's worth of data.
#[derive(Debug)]
pub struct Snapshot {
    pub arrays: Vec<(ArrayStatus, Option<IoMetrics>)>,
    /// Arrays whose status could not be read.
    pub unreadable: Vec<String>,
}

type Labels = Vec<(&'static str, String)>;

/// A label value as the exposition format writes it: backslash, double quote and newline
/// escaped (`\\`, `\"`, `\n`). prometheus-client writes label values raw (its issue 151),
/// and names reach labels from outside (member paths, failure domains, names read from
/// superblocks): unescaped, a path holding `"` and a newline forges whole series.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Every label value escaped; each family encodes only these.
fn escaped(labels: &Labels) -> Labels {
    labels.iter().map(|(k, v)| (*k, escape_label(v))).collect()
}

fn member_label(m: &MemberStatus) -> String {
    m.path
        .clone()
        .or_else(|| m.uuid.clone())
        .unwrap_or_else(|| format!("slot{}", m.slot.unwrap_or(0)))
}

/// One metric family: a name, help, type and its labelled samples.
struct Family<'a> {
    enc: MetricEncoder<'a>,
}

impl Family<'_> {
    fn gauge(&mut self, labels: &Labels, v: f64) -> Result<(), std::fmt::Error> {
        ConstGauge::new(v).encode(self.enc.encode_family(&escaped(labels))?)
    }

    fn counter(&mut self, labels: &Labels, v: u64) -> Result<(), std::fmt::Error> {
        ConstCounter::new(v).encode(self.enc.encode_family(&escaped(labels))?)
    }
}

fn family<'a>(
    enc: &'a mut DescriptorEncoder,
    name: &'a str,
    help: &str,
    t: MetricType,
) -> Result<Family<'a>, std::fmt::Error> {
    Ok(Family {
        enc: enc.encode_descriptor(name, help, None, t)?,
    })
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let arr = |s: &ArrayStatus| -> Labels { vec![("array", s.status.name.clone())] };
        let with = |mut l: Labels, k: &'static str, v: String| {
            l.push((k, v));
            l
        };
        let mem = |s: &ArrayStatus, m: &MemberStatus| with(arr(s), "member", member_label(m));

        let mut f = family(
            &mut enc,
            "sbod_array_state",
            "1 for the array's current state (optimal, degraded, rebuilding, resyncing, failed)",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for st in ArrayState::ALL {
                let v = if s.status.state == *st { 1.0 } else { 0.0 };
                f.gauge(&with(arr(s), "state", st.to_string()), v)?;
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_array_info",
            "Always 1: the array's level, uuid and whether a process serves it",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            let l = with(
                with(
                    with(arr(s), "level", s.status.level.to_string()),
                    "uuid",
                    s.status.uuid.clone(),
                ),
                "served",
                s.running.to_string(),
            );
            f.gauge(&l, 1.0)?;
        }
        let mut f = family(
            &mut enc,
            "sbod_array_size_bytes",
            "Usable size of the array",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            f.gauge(&arr(s), s.status.size as f64)?;
        }
        let mut f = family(
            &mut enc,
            "sbod_array_redundancy",
            "Members per group the array may lose",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            f.gauge(&arr(s), s.status.redundancy as f64)?;
        }

        let mut f = family(
            &mut enc,
            "sbod_member_state",
            "1 for each member's current state (active, failed, spare, rebuilding, missing, replacing, empty)",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                for st in MemberState::ALL {
                    let v = if m.state == *st { 1.0 } else { 0.0 };
                    f.gauge(&with(mem(s, m), "state", st.to_string()), v)?;
                }
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_member_info",
            "Always 1: each member's slot, group, failure domain and uuid",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                let opt = |v: Option<usize>| v.map(|x| x.to_string()).unwrap_or_default();
                let l = with(
                    with(
                        with(with(mem(s, m), "slot", opt(m.slot)), "group", opt(m.group)),
                        "domain",
                        m.domain.clone(),
                    ),
                    "uuid",
                    m.uuid.clone().unwrap_or_default(),
                );
                f.gauge(&l, 1.0)?;
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_member_size_bytes",
            "Data bytes each member holds",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                f.gauge(&mem(s, m), m.size as f64)?;
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_member_errors",
            "Errors seen on each member, by kind (read, write, checksum; tag: checksums found damaged over right data and rewritten)",
            MetricType::Counter,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                for (k, v) in [
                    ("read", m.read_errors),
                    ("write", m.write_errors),
                    ("checksum", m.checksum_errors),
                    ("tag", m.tag_errors),
                ] {
                    f.counter(&with(mem(s, m), "kind", k.into()), v)?;
                }
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_member_recovered_bytes",
            "Rebuilding or replacing members: bytes of member data valid so far",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                if let Some(r) = m.recovered {
                    f.gauge(&mem(s, m), r as f64)?;
                }
            }
        }

        // Members' disks (issue 28): health verdicts as state gauges, the counters SMART
        // reports, temperature; members whose health cannot be read (files, remote and
        // virtual disks) are `unavailable`, with no counters.
        let mut f = family(
            &mut enc,
            "sbod_member_health",
            "1 for each member's disk health verdict (ok, warn, failing, unavailable) against the array's health policy",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                let Some(h) = &m.health else { continue };
                for v in sbod_types::HealthVerdict::ALL {
                    let x = if h.verdict == *v { 1.0 } else { 0.0 };
                    f.gauge(&with(mem(s, m), "verdict", v.to_string()), x)?;
                }
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_member_health_sectors",
            "SMART counters of each member's disk, by kind (reallocated, pending, uncorrectable, media_errors, crc_errors)",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                let Some(h) = &m.health else { continue };
                for (k, v) in [
                    ("reallocated", h.reallocated_sectors),
                    ("pending", h.pending_sectors),
                    ("uncorrectable", h.uncorrectable_sectors),
                    ("media_errors", h.media_errors),
                    ("crc_errors", h.crc_errors),
                ] {
                    if let Some(v) = v {
                        f.gauge(&with(mem(s, m), "kind", k.into()), v as f64)?;
                    }
                }
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_member_health_percentage_used",
            "NVMe: percent of the drive's rated endurance used",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                if let Some(v) = m.health.as_ref().and_then(|h| h.percentage_used) {
                    f.gauge(&mem(s, m), v as f64)?;
                }
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_member_health_critical_warning",
            "NVMe: the critical warning bits (0: none)",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                if let Some(v) = m.health.as_ref().and_then(|h| h.critical_warning) {
                    f.gauge(&mem(s, m), v as f64)?;
                }
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_member_temperature_celsius",
            "Each member's disk temperature as SMART reports it",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                if let Some(v) = m.health.as_ref().and_then(|h| h.temperature_celsius) {
                    f.gauge(&mem(s, m), v as f64)?;
                }
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_member_disk_info",
            "Always 1: each member's disk: enclosure, slot, WWN, serial (empty where unknown)",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            for m in &s.status.members {
                if m.identity.is_none() && m.location.is_none() {
                    continue;
                }
                let id = m.identity.clone().unwrap_or_default();
                let loc = m.location.clone().unwrap_or_default();
                let l = with(
                    with(
                        with(
                            with(mem(s, m), "enclosure", loc.enclosure),
                            "enclosure_slot",
                            loc.slot,
                        ),
                        "wwn",
                        id.wwn.unwrap_or_default(),
                    ),
                    "serial",
                    id.serial.unwrap_or_default(),
                );
                f.gauge(&l, 1.0)?;
            }
        }

        // Background processes: the running one (md's sync_completed).
        for (name, help, get) in [
            (
                "sbod_array_process_done_bytes",
                "Bytes the running background process (rebuild, check, repair, resync) has done",
                (|p: &sbod_types::ProcessStatus| p.done) as fn(&sbod_types::ProcessStatus) -> u64,
            ),
            (
                "sbod_array_process_total_bytes",
                "Bytes the running background process has to do",
                |p| p.total,
            ),
        ] {
            let mut f = family(&mut enc, name, help, MetricType::Gauge)?;
            for (s, _) in &self.arrays {
                if let Some(p) = &s.status.process {
                    f.gauge(&with(arr(s), "process", p.kind.to_string()), get(p) as f64)?;
                }
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_array_last_scrub_mismatches",
            "Mismatched blocks the last finished check or repair found",
            MetricType::Gauge,
        )?;
        for (s, _) in &self.arrays {
            if let Some(p) = s.status.last_process.as_ref().filter(|p| {
                matches!(
                    p.kind,
                    sbod_types::ProcessKind::Check | sbod_types::ProcessKind::Repair
                )
            }) {
                f.gauge(&arr(s), p.mismatches as f64)?;
            }
        }

        // Client I/O of served arrays.
        let io: Vec<(&ArrayStatus, &IoMetrics)> = self
            .arrays
            .iter()
            .filter_map(|(s, m)| m.as_ref().map(|m| (s, m)))
            .collect();
        for (name, help, get) in [
            (
                "sbod_array_reads",
                "Client read requests served",
                (|m: &IoMetrics| m.reads) as fn(&IoMetrics) -> u64,
            ),
            ("sbod_array_read_bytes", "Bytes read by clients", |m| {
                m.read_bytes
            }),
            ("sbod_array_writes", "Client write requests served", |m| {
                m.writes
            }),
            (
                "sbod_array_written_bytes",
                "Bytes written by clients",
                |m| m.write_bytes,
            ),
            ("sbod_array_flushes", "Client flush requests", |m| m.flushes),
            (
                "sbod_array_trims",
                "Client trim and write-zeroes requests",
                |m| m.trims,
            ),
            (
                "sbod_array_request_errors",
                "Client requests answered with an error",
                |m| m.errors,
            ),
        ] {
            let mut f = family(&mut enc, name, help, MetricType::Counter)?;
            for (s, m) in &io {
                f.counter(&arr(s), get(m))?;
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_array_request_duration_seconds",
            "Latency of client requests, by operation (read, write, flush)",
            MetricType::Histogram,
        )?;
        for (s, m) in &io {
            for h in &m.latency {
                let mut buckets: Vec<(f64, u64)> = h
                    .bounds_secs
                    .iter()
                    .copied()
                    .zip(h.counts.iter().copied())
                    .collect();
                // The encoder writes f64::MAX as +Inf.
                buckets.push((f64::MAX, h.counts.last().copied().unwrap_or(0)));
                let l = escaped(&with(arr(s), "op", h.op.clone()));
                let mut e = f.enc.encode_family(&l)?;
                e.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    h.sum_secs,
                    h.count(),
                    &buckets,
                    None,
                )?;
            }
        }
        let mut f = family(
            &mut enc,
            "sbod_scrape_unreadable_arrays",
            "Registered arrays whose status could not be read in this scrape",
            MetricType::Gauge,
        )?;
        f.gauge(&vec![], self.unreadable.len() as f64)?;
        Ok(())
    }
}

/// The text of one scrape.
pub fn render(snap: Snapshot) -> String {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(snap));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).expect("writing to a String");
    out
}

#[cfg(test)]
mod tests {
    use super::escape_label;

    /// Health, temperature and the disk's place become series; a member whose health
    /// cannot be read is `unavailable` with no counters.
    #[test]
    fn member_health_is_exported() {
        let st: sbod_types::ArrayStatus = serde_json::from_value(serde_json::json!({
            "name": "v", "uuid": "x", "level": "raid1", "state": "optimal", "failed_reason": null,
            "size": 1, "chunk": 65536, "groups": 1, "width": 2, "redundancy": 1, "event": 1,
            "members": [
                {"slot": 0, "group": 0, "path": "/dev/nvme0n1", "uuid": "a", "state": "active",
                 "domain": "", "size": 1, "read_errors": 0, "write_errors": 0,
                 "checksum_errors": 0, "repaired": 0, "reads": 0, "writes": 0, "recovered": null,
                 "health": {"verdict": "warn", "reasons": ["93 % of rated endurance used"],
                            "protocol": "nvme", "percentage_used": 93, "media_errors": 0,
                            "critical_warning": 0, "temperature_celsius": 38, "checked": 1},
                 "location": {"enclosure": "pci", "slot": "7", "led": true},
                 "identity": {"wwn": "eui.0025388b71e2a1c4", "serial": "S64H"}},
                {"slot": 1, "group": 0, "path": "/srv/d1.img", "uuid": "b", "state": "active",
                 "domain": "", "size": 1, "read_errors": 0, "write_errors": 0,
                 "checksum_errors": 0, "repaired": 0, "reads": 0, "writes": 0, "recovered": null,
                 "health": {"verdict": "unavailable", "reasons": ["a file"]}}
            ],
            "process": null, "last_process": null, "bitmap_region": null, "dirty_regions": 0,
            "resync_offset": null, "assembly": {"unclean": false, "resynced_bytes": 0,
            "resynced_regions": 0, "rebuilding": [], "ignored": [], "missing": []},
            "running": true
        }))
        .unwrap();
        let text = super::render(super::Snapshot {
            arrays: vec![(st, None)],
            unreadable: vec![],
        });
        for want in [
            "sbod_member_health{array=\"v\",member=\"/dev/nvme0n1\",verdict=\"warn\"} 1",
            "sbod_member_health{array=\"v\",member=\"/srv/d1.img\",verdict=\"unavailable\"} 1",
            "sbod_member_health{array=\"v\",member=\"/srv/d1.img\",verdict=\"ok\"} 0",
            "sbod_member_health_percentage_used{array=\"v\",member=\"/dev/nvme0n1\"} 93",
            "sbod_member_health_sectors{array=\"v\",member=\"/dev/nvme0n1\",kind=\"media_errors\"} 0",
            "sbod_member_temperature_celsius{array=\"v\",member=\"/dev/nvme0n1\"} 38",
            "enclosure=\"pci\",enclosure_slot=\"7\",wwn=\"eui.0025388b71e2a1c4\",serial=\"S64H\"} 1",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert!(
            !text.contains("sbod_member_temperature_celsius{array=\"v\",member=\"/srv/d1.img\"")
        );
    }

    #[test]
    fn label_values_are_escaped_as_the_exposition_format_says() {
        assert_eq!(escape_label("plain /dev/sdb"), "plain /dev/sdb");
        assert_eq!(
            escape_label("a\\b\"c\nd"),
            "a\\\\b\\\"c\\nd",
            "backslash, quote, newline"
        );
        // Nothing of a hostile value can close the quotes it is written in.
        let v = escape_label("x\"}\nsbod_array_state{array=\"FORGED\"} 1\n");
        assert!(!v.contains('\n'));
        assert!(v
            .split("\\\\")
            .all(|p| !p.replace("\\\"", "").contains('"')));
    }
}
