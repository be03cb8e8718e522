//! The report document: `sbod-bench/1`. Documented field by field in docs/LAB.md; a test
//! compares the document's structure against a golden list, so a change here is a schema
//! change (bump [`SCHEMA`] when a field changes meaning or goes away).

use serde::{Deserialize, Serialize};

/// The schema identifier every report carries.
pub const SCHEMA: &str = "sbod-bench/1";

/// One benchmark report.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub schema: String,
    /// "demo" or "bench".
    pub mode: String,
    /// RFC 3339 UTC time the run started.
    pub started: String,
    /// Wall time of the whole run, seconds.
    pub duration_secs: f64,
    /// True when the run was stopped before it finished (Ctrl-C or an error).
    pub incomplete: bool,
    pub tool: Tool,
    pub machine: Machine,
    pub array: ArrayInfo,
    pub settings: Settings,
    pub workloads: Vec<Workload>,
    pub phases: Vec<PhaseInfo>,
    pub runs: Vec<Run>,
    pub cells: Vec<Cell>,
    pub rebuild: Option<RebuildInfo>,
    /// Measurements whose coefficient of variation exceeded the threshold, in words.
    pub flags: Vec<String>,
    /// What the reader should know (skipped phases, a rebuild that ended early, errors).
    pub notes: Vec<String>,
    /// The least CPU a byte of a client write costs on this machine, measured before the
    /// run (null where it was not).
    #[serde(default)]
    pub floor: Option<CpuFloor>,
}

/// The CPU floor of a write (docs/PERFORMANCE.md, "The floor"): client bytes per second
/// of one thread's CPU time for what every written byte costs at the least: one copy,
/// its crc32c, and for a parity layout the parity of the stripe (whose bytes are copied
/// and summed too). The server's bytes per CPU-second are held against it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CpuFloor {
    /// One copy of the bytes (memory to memory, streaming through more than the caches).
    pub copy: f64,
    /// One copy and the crc32c of every 4 KiB block: a plain layout's floor.
    pub copy_crc32c: f64,
    /// The array's layout: its copies (data and parity), parity and checksums, per client
    /// byte; null for a layout without parity.
    pub layout: Option<f64>,
    /// The layout the `layout` figure is for (e.g. "raid6 6+2"), and how it was measured.
    pub what: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Tool {
    pub sbod_version: String,
    pub fio_version: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct Machine {
    pub hostname: String,
    pub os: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: u32,
    pub memory_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ArrayInfo {
    pub name: String,
    /// raid0, raid1, raid10, raid5, raid6, ec:K+M or concat.
    pub level: String,
    pub chunk_bytes: u64,
    pub groups: u32,
    /// Members per group (raid10: copies per mirror set).
    pub width: u32,
    /// Member failures the array survives.
    pub redundancy: u32,
    /// The groups' stripes are spread over every member (`sbod create --declustered`).
    #[serde(default)]
    pub declustered: bool,
    /// Usable size of the volume, bytes.
    pub size_bytes: u64,
    pub members: Vec<MemberInfo>,
}

impl ArrayInfo {
    /// Every member is a disk that seeks ([`MemberInfo::rotational`]); false without members.
    pub fn on_disks(&self) -> bool {
        !self.members.is_empty() && self.members.iter().all(|m| m.rotational)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MemberInfo {
    pub slot: u32,
    pub path: String,
    pub size_bytes: u64,
    /// "file", "block", "model" (a modelled drive) or "nbd" (a remote member, by its NBD
    /// URI).
    pub kind: String,
    /// The member streams like a disk: a block device the kernel calls rotational, or a
    /// modelled HDD (reports from before this was known: false).
    #[serde(default)]
    pub rotational: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    pub runtime_secs: f64,
    pub ramp_secs: f64,
    pub repetitions: u32,
    /// COV (stddev / mean of IOPS over the repetitions) above which a cell is flagged.
    pub cov_threshold: f64,
    /// "none", "seq" (one sequential pass) or "full" (two sequential passes and a random one).
    pub precondition: String,
    /// Bytes of the volume the workloads address (from offset 0).
    pub working_set_bytes: u64,
    /// How BASELINE jobs get their queue depth: see docs/LAB.md.
    pub baseline_iodepth: String,
    /// Client connections of the RAID set's jobs: "auto" (as many as BASELINE's for the
    /// same depth) or a count; reports from before the setting used one.
    #[serde(default = "one_connection")]
    pub connections: String,
    /// Percentiles fio reports for every run.
    pub percentiles: Vec<f64>,
    /// Rebuild rate limit applied during DEVICE REBUILD, bytes/s (null: the array's default).
    pub rebuild_rate_limit: Option<u64>,
    /// Queue depths of the sweep (empty: no sweep).
    pub qd_sweep: Vec<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Workload {
    /// Stable identifier, e.g. "randread-4k".
    pub id: String,
    pub title: String,
    /// fio --rw.
    pub rw: String,
    /// fio --bs, or null when `bssplit` is set.
    pub bs: Option<String>,
    pub bssplit: Option<String>,
    /// Percent reads of a mixed workload.
    pub rwmixread: Option<u32>,
    /// Queue depth of the RAID job (sweep workloads: of each sweep point).
    pub iodepth: u32,
    /// A queue-depth sweep workload (measured at every depth in settings.qd_sweep).
    pub sweep: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PhaseInfo {
    /// "baseline", "nominal", "device-down" or "device-rebuild".
    pub id: String,
    pub title: String,
    /// Seconds from the start of the run.
    pub started_secs: f64,
    pub duration_secs: f64,
    /// Set when the phase did not run or ran only in part, with the reason.
    pub note: Option<String>,
}

/// One fio measurement.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Run {
    pub phase: String,
    pub workload: String,
    pub iodepth: u32,
    /// Client connections (fio job sections) the depth was spread over.
    #[serde(default = "one")]
    pub connections: u32,
    /// 1-based repetition.
    pub rep: u32,
    pub started_secs: f64,
    pub wall_secs: f64,
    pub metrics: Metrics,
    /// During DEVICE REBUILD: the rebuild's progress in percent when the run started and ended.
    pub rebuild_percent: Option<[f64; 2]>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct Metrics {
    pub iops: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub bw_bytes: f64,
    /// Completion-inclusive latency (fio lat_ns: submission to completion).
    pub lat_mean_ns: f64,
    pub lat_p50_ns: f64,
    pub lat_p99_ns: f64,
    pub lat_p999_ns: f64,
    /// CPU of the sbod server process(es), usr+sys, percent of one CPU.
    pub server_cpu_pct: f64,
    /// iops / server_cpu_pct (0 when no CPU was measured).
    pub iops_per_cpu_pct: f64,
    /// Client bytes moved per second of the server's CPU (usr+sys): bw_bytes /
    /// (server_cpu_pct / 100), 0 when no CPU was measured; held against the report's
    /// [`CpuFloor`].
    #[serde(default)]
    pub bytes_per_cpu_sec: f64,
    /// fio's own usr+sys CPU, percent of one CPU.
    pub client_cpu_pct: f64,
    /// [percentile, latency ns] pairs, ascending.
    pub percentiles: Vec<[f64; 2]>,
}

/// The repetitions of one (phase, workload, iodepth), summarised.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Cell {
    pub phase: String,
    pub workload: String,
    pub iodepth: u32,
    /// Repetitions summarised.
    pub n: u32,
    /// Means over the repetitions (percentile curve: mean per percentile).
    pub mean: Metrics,
    pub cov: Cov,
    /// COV of IOPS above settings.cov_threshold.
    pub flagged: bool,
    /// This cell / the BASELINE cell of the same workload and depth.
    pub vs_baseline: Option<Ratios>,
    /// This cell / the NOMINAL cell of the same workload and depth.
    pub vs_nominal: Option<Ratios>,
    /// The layout's ideal ratio to BASELINE for this cell where the drives are the limit
    /// (see `ideal`); null where the model has none.
    #[serde(default)]
    pub ideal: Option<Ideal>,
}

/// A layout's ideal ratio to BASELINE (docs/LAB.md, "The layout's ideal").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Ideal {
    /// The ideal ratio to BASELINE (of IOPS, which for one block size is of bandwidth).
    pub ratio: f64,
    /// The measured ratio over the ideal (null without a BASELINE).
    pub of_ideal: Option<f64>,
    /// The fraction of the ideal issue 31 aims for on this row (null: none set).
    pub aim: Option<f64>,
}

/// Coefficients of variation (sample stddev / mean) over the repetitions.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct Cov {
    pub iops: f64,
    pub bw_bytes: f64,
    pub lat_mean_ns: f64,
    pub lat_p99_ns: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct Ratios {
    pub iops: f64,
    pub bw_bytes: f64,
    pub lat_mean_ns: f64,
    pub lat_p99_ns: f64,
    pub iops_per_cpu_pct: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RebuildInfo {
    /// The member failed for DEVICE DOWN.
    pub failed_member: String,
    /// What rebuilt in its place (the same device, wiped, unless a replacement was given).
    pub replacement: String,
    /// Bytes the rebuild wrote to the replacement.
    pub bytes: u64,
    /// Seconds from the start of the run.
    pub started_secs: f64,
    /// Null when the rebuild did not finish (the run was stopped).
    pub duration_secs: Option<f64>,
    /// bytes / duration.
    pub rate_bytes_per_sec: Option<f64>,
    /// True when the rebuild finished before the DEVICE REBUILD workloads did.
    pub finished_during_workloads: bool,
    /// Seconds of the rebuild that overlapped workloads.
    pub under_load_secs: f64,
    /// Seconds from the request until the server's rebuild process was first seen running
    /// (null if it never was).
    pub start_delay_secs: Option<f64>,
    /// [seconds since the rebuild started, percent done] samples.
    pub samples: Vec<[f64; 2]>,
}

/// Phase identifiers, in life-cycle order.
pub const BASELINE: &str = "baseline";
pub const NOMINAL: &str = "nominal";
pub const DEVICE_DOWN: &str = "device-down";
pub const DEVICE_REBUILD: &str = "device-rebuild";
pub const PHASES: [&str; 4] = [BASELINE, NOMINAL, DEVICE_DOWN, DEVICE_REBUILD];

pub fn phase_title(id: &str) -> &'static str {
    match id {
        BASELINE => "BASELINE",
        NOMINAL => "NOMINAL",
        DEVICE_DOWN => "DEVICE DOWN",
        DEVICE_REBUILD => "DEVICE REBUILD",
        _ => "?",
    }
}

impl Report {
    pub fn workload(&self, id: &str) -> Option<&Workload> {
        self.workloads.iter().find(|w| w.id == id)
    }

    pub fn cell(&self, phase: &str, workload: &str, iodepth: u32) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.phase == phase && c.workload == workload && c.iodepth == iodepth)
    }

    /// Parse a report, refusing other schemas.
    pub fn from_json(text: &str) -> anyhow::Result<Report> {
        let v: serde_json::Value = serde_json::from_str(text)?;
        match v.get("schema").and_then(|s| s.as_str()) {
            Some(SCHEMA) => Ok(serde_json::from_value(v)?),
            Some(other) => anyhow::bail!("report schema is '{other}', this sbod reads '{SCHEMA}'"),
            None => anyhow::bail!("not an sbod bench report (no \"schema\" field)"),
        }
    }
}

fn one_connection() -> String {
    "1".into()
}

fn one() -> u32 {
    1
}
