//! SMART health from smartmontools: `smartctl --json -a DEV` parsed with serde into a
//! [`Health`] (ATA, SCSI and NVMe), judged against the array's [`HealthPolicy`].
//!
//! smartctl is run as a subprocess (it knows every controller, vendor quirk and
//! pass-through, which sbod should not re-learn) with a timeout: a disk that hangs on a
//! SMART command must not hang the caller. Where health cannot be read (a file, a remote
//! member, a virtual disk, no smartctl) the result says so and why, never a guess.

use sbod_types::{DiskProtocol, Health, HealthPolicy, HealthVerdict, Threshold};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The parts of smartctl's JSON (smartmontools' `--json` schema, format version 1) that
/// health needs; everything else is ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Report {
    smartctl: Option<SmartctlInfo>,
    device: Option<Device>,
    model_name: Option<String>,
    scsi_model_name: Option<String>,
    scsi_product: Option<String>,
    serial_number: Option<String>,
    smart_status: Option<SmartStatus>,
    ata_smart_attributes: Option<AtaAttributes>,
    nvme_smart_health_information_log: Option<NvmeLog>,
    scsi_grown_defect_list: Option<u64>,
    scsi_pending_defects: Option<Count>,
    scsi_error_counter_log: Option<BTreeMap<String, ScsiCounters>>,
    temperature: Option<Temperature>,
    power_on_time: Option<PowerOn>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SmartctlInfo {
    messages: Vec<Message>,
    exit_status: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Message {
    string: String,
    severity: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Device {
    name: String,
    protocol: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SmartStatus {
    passed: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AtaAttributes {
    table: Vec<AtaAttribute>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AtaAttribute {
    id: u32,
    name: String,
    /// "now", "past" or "" (smartctl's WHEN_FAILED column).
    when_failed: String,
    flags: AtaFlags,
    raw: Raw,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AtaFlags {
    prefailure: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Raw {
    value: u64,
    string: String,
}

impl Raw {
    /// The count a raw value stands for. Vendors pack other fields into the upper bytes of
    /// some raw values (the 48-bit `value`); the leading number of smartctl's own
    /// rendering (`string`, "12" or "35 (Min/Max 20/41)") is the count it decoded.
    fn count(&self) -> u64 {
        let lead: String = self
            .string
            .trim()
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        lead.parse().unwrap_or(self.value)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NvmeLog {
    critical_warning: u8,
    temperature: Option<i64>,
    available_spare: Option<u64>,
    available_spare_threshold: Option<u64>,
    percentage_used: Option<u8>,
    power_on_hours: Option<u64>,
    media_errors: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Count {
    count: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ScsiCounters {
    total_uncorrected_errors: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Temperature {
    current: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PowerOn {
    hours: Option<u64>,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// smartctl's exit status bits (smartctl(8), "RETURN VALUES").
const EXIT_CMDLINE: u32 = 1 << 0;
const EXIT_OPEN: u32 = 1 << 1;
const EXIT_DISK_FAILING: u32 = 1 << 3;

/// Parse `smartctl --json -a` output into health, judged against `policy`.
pub fn parse(json: &str, policy: &HealthPolicy) -> Health {
    let r: Report = match serde_json::from_str(json) {
        Ok(r) => r,
        Err(e) => return Health::unavailable(format!("smartctl's output did not parse: {e}")),
    };
    let info = r.smartctl.unwrap_or_default();
    let errors: Vec<&str> = info
        .messages
        .iter()
        .filter(|m| m.severity == "error")
        .map(|m| m.string.as_str())
        .collect();
    let protocol = r
        .device
        .as_ref()
        .and_then(|d| match d.protocol.to_ascii_lowercase().as_str() {
            "ata" => Some(DiskProtocol::Ata),
            "scsi" => Some(DiskProtocol::Scsi),
            "nvme" => Some(DiskProtocol::Nvme),
            _ => None,
        });
    let has_data = r.smart_status.is_some()
        || r.ata_smart_attributes.is_some()
        || r.nvme_smart_health_information_log.is_some()
        || r.scsi_grown_defect_list.is_some();
    if info.exit_status & (EXIT_CMDLINE | EXIT_OPEN) != 0 || protocol.is_none() || !has_data {
        let why = if errors.is_empty() {
            "smartctl read no health data from it".to_string()
        } else {
            format!("smartctl cannot read it: {}", errors.join("; "))
        };
        return Health {
            checked: now(),
            ..Health::unavailable(why)
        };
    }
    let mut h = Health {
        verdict: HealthVerdict::Ok,
        protocol,
        passed: r.smart_status.as_ref().and_then(|s| s.passed),
        model: r.model_name.or(r.scsi_model_name).or(r.scsi_product),
        serial: r.serial_number,
        temperature_celsius: r.temperature.as_ref().and_then(|t| t.current),
        power_on_hours: r.power_on_time.as_ref().and_then(|p| p.hours),
        checked: now(),
        ..Health::default()
    };
    let mut prefail_now = Vec::new();
    if let Some(a) = &r.ata_smart_attributes {
        let by_id = |id: u32| a.table.iter().find(|x| x.id == id).map(|x| x.raw.count());
        h.reallocated_sectors = by_id(5);
        h.pending_sectors = by_id(197);
        h.uncorrectable_sectors = by_id(198).or(by_id(187));
        h.crc_errors = by_id(199);
        if h.temperature_celsius.is_none() {
            h.temperature_celsius = by_id(194).or(by_id(190)).map(|t| t as i64);
        }
        prefail_now = a
            .table
            .iter()
            .filter(|x| x.flags.prefailure && x.when_failed == "now")
            .map(|x| format!("{} ({}) at or below its threshold", x.name, x.id))
            .collect();
    }
    let mut nvme_warnings = Vec::new();
    if let Some(n) = &r.nvme_smart_health_information_log {
        h.critical_warning = Some(n.critical_warning);
        h.percentage_used = n.percentage_used;
        h.media_errors = n.media_errors;
        h.power_on_hours = h.power_on_hours.or(n.power_on_hours);
        h.temperature_celsius = h.temperature_celsius.or(n.temperature);
        if let (Some(s), Some(t)) = (n.available_spare, n.available_spare_threshold) {
            if s < t {
                nvme_warnings.push((
                    true,
                    format!("available spare {s}% below its threshold {t}%"),
                ));
            }
        }
        // NVMe base specification, SMART / Health Information log, Critical Warning.
        for (bit, failing, what) in [
            (0x01, true, "spare capacity below its threshold"),
            (0x02, false, "temperature outside its limits"),
            (
                0x04,
                true,
                "reliability degraded by media or internal errors",
            ),
            (0x08, true, "media placed in read-only mode"),
            (0x10, false, "volatile memory backup failed"),
            (
                0x20,
                true,
                "persistent memory region read-only or unreliable",
            ),
        ] {
            if n.critical_warning & bit != 0 {
                nvme_warnings.push((failing, format!("critical warning: {what}")));
            }
        }
    }
    if r.scsi_grown_defect_list.is_some() {
        h.reallocated_sectors = r.scsi_grown_defect_list;
        h.pending_sectors = r.scsi_pending_defects.as_ref().map(|c| c.count);
        h.uncorrectable_sectors = r.scsi_error_counter_log.as_ref().map(|log| {
            log.values()
                .filter_map(|c| c.total_uncorrected_errors)
                .sum()
        });
    }
    if h.passed.is_none() && info.exit_status & EXIT_DISK_FAILING != 0 {
        h.passed = Some(false);
    }
    judge(&mut h, policy, &prefail_now, &nvme_warnings);
    h
}

/// The verdict: failing where the drive says so or a counter is at its failing threshold,
/// warn at a warning threshold, ok otherwise; each reason in words.
fn judge(h: &mut Health, p: &HealthPolicy, prefail_now: &[String], nvme: &[(bool, String)]) {
    let mut failing = Vec::new();
    let mut warn = Vec::new();
    if h.passed == Some(false) {
        failing.push("the drive's own SMART assessment: FAILED".to_string());
    }
    failing.extend(prefail_now.iter().cloned());
    for (f, w) in nvme {
        if *f { &mut failing } else { &mut warn }.push(w.clone());
    }
    let mut check = |v: Option<u64>, t: &Threshold, what: &str| {
        let Some(v) = v else { return };
        if t.fail.is_some_and(|f| v >= f) {
            failing.push(format!("{v} {what} (failing at {})", t.fail.unwrap_or(0)));
        } else if t.warn.is_some_and(|w| v >= w) {
            warn.push(format!("{v} {what} (warning at {})", t.warn.unwrap_or(0)));
        }
    };
    check(h.reallocated_sectors, &p.reallocated, "reallocated sectors");
    check(h.pending_sectors, &p.pending, "pending sectors");
    check(
        h.uncorrectable_sectors,
        &p.uncorrectable,
        "uncorrectable errors",
    );
    check(h.media_errors, &p.media_errors, "media errors");
    check(
        h.crc_errors,
        &p.crc_errors,
        "link CRC errors (cable or backplane)",
    );
    check(
        h.percentage_used.map(u64::from),
        &p.percentage_used,
        "% of rated endurance used",
    );
    check(
        h.temperature_celsius.map(|t| t.max(0) as u64),
        &p.temperature,
        "°C",
    );
    h.verdict = if !failing.is_empty() {
        HealthVerdict::Failing
    } else if !warn.is_empty() {
        HealthVerdict::Warn
    } else {
        HealthVerdict::Ok
    };
    h.reasons = failing.into_iter().chain(warn).collect();
}

/// Judge a health read earlier against another policy (the thresholds changed).
pub fn rejudge(h: &Health, policy: &HealthPolicy) -> Health {
    if h.verdict == HealthVerdict::Unavailable {
        return h.clone();
    }
    let mut out = h.clone();
    // What only the raw report knew (prefail attributes, NVMe bits) is kept from the
    // reasons: the drive's own words do not depend on the thresholds.
    let kept: Vec<(bool, String)> = h
        .reasons
        .iter()
        .filter(|r| {
            r.contains("at or below its threshold")
                || r.starts_with("critical warning")
                || r.starts_with("available spare")
        })
        .map(|r| {
            let failing = !(r.contains("temperature outside") || r.contains("volatile memory"));
            (failing, r.clone())
        })
        .collect();
    judge(&mut out, policy, &[], &kept);
    out
}

/// How smartctl is run.
#[derive(Clone, Debug)]
pub struct Smartctl {
    /// The program (`SBOD_SMARTCTL`, else `smartctl` on PATH or in /usr/sbin).
    pub program: PathBuf,
    /// A disk that does not answer within it is reported as not available.
    pub timeout: Duration,
}

impl Default for Smartctl {
    fn default() -> Smartctl {
        let program = std::env::var_os("SBOD_SMARTCTL")
            .map(PathBuf::from)
            .or_else(|| find_program("smartctl"))
            .unwrap_or_else(|| PathBuf::from("smartctl"));
        Smartctl {
            program,
            timeout: Duration::from_secs(30),
        }
    }
}

/// A program on PATH, or in the sbin directories a non-root PATH may lack.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Smartctl {
    /// Whether smartctl can be run at all.
    pub fn installed(&self) -> bool {
        self.program.is_file() || find_program(&self.program.to_string_lossy()).is_some()
    }

    /// Read the health of the block device `dev` (a whole disk or NVMe namespace).
    pub fn read(&self, dev: &Path, policy: &HealthPolicy) -> Health {
        if !self.installed() {
            return Health::unavailable(format!(
                "smartctl not found ({}): install smartmontools",
                self.program.display()
            ));
        }
        match run_with_timeout(
            std::process::Command::new(&self.program)
                .arg("--json")
                .arg("-a")
                .arg(dev),
            self.timeout,
        ) {
            Ok((_, out)) => parse(&out, policy),
            Err(e) => Health {
                checked: now(),
                ..Health::unavailable(format!("smartctl on {}: {e}", dev.display()))
            },
        }
    }
}

/// Run a command to its end: its exit status and standard output as text; killed past
/// `timeout`. (By hand: a poll of `try_wait`, which is all a timeout on one child needs.)
pub fn run_with_timeout(
    cmd: &mut std::process::Command,
    timeout: Duration,
) -> std::io::Result<(std::process::ExitStatus, String)> {
    use std::io::Read;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).map(|_| s)
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if start.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {}s", timeout.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = reader
        .join()
        .map_err(|_| std::io::Error::other("reader thread panicked"))??;
    Ok((status, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_counts_take_smartctls_decoding() {
        let r = Raw {
            value: 0x0029_0014_0023,
            string: "35 (Min/Max 20/41)".into(),
        };
        assert_eq!(r.count(), 35);
        let r = Raw {
            value: 7,
            string: String::new(),
        };
        assert_eq!(r.count(), 7);
    }

    #[test]
    fn garbage_is_not_available() {
        let h = parse("not json", &HealthPolicy::default());
        assert_eq!(h.verdict, HealthVerdict::Unavailable);
        assert!(h.reasons[0].contains("did not parse"), "{h:?}");
    }

    #[test]
    fn a_timeout_kills_and_says_so() {
        let e = run_with_timeout(
            std::process::Command::new("sleep").arg("5"),
            Duration::from_millis(100),
        )
        .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    }
}
