//! A member's disk as the operator sees it: its health (SMART, read with smartmontools), its
//! place in the rack (enclosure and slot) and a stable identity (WWN, serial, by-id path)
//! that survives a new /dev name after a reboot. `crates/sbod-health` reads them; every
//! client shows them. Field names and words are a public interface: add, never rename.

use serde::{Deserialize, Serialize};

word_enum! {
    /// What the health of a member's disk says, against the array's thresholds.
    HealthVerdict {
        /// Nothing above the thresholds.
        Ok = "ok",
        /// Worth watching: a counter past its warning threshold (the reasons say which).
        Warn = "warn",
        /// Predicted to fail: the drive says so (SMART overall status, NVMe critical
        /// warning) or a counter is past its failing threshold. Replaced proactively where
        /// a hot spare exists and the policy allows.
        Failing = "failing",
        /// Health cannot be read here (a file, a virtual disk, a remote member, no
        /// smartctl): the reason says why. Never guessed.
        Unavailable = "unavailable",
    }
}

word_enum! {
    /// The protocol smartctl spoke to the disk.
    DiskProtocol {
        Ata = "ata",
        Scsi = "scsi",
        Nvme = "nvme",
    }
}

/// One reading of a member's disk health.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub verdict: HealthVerdict,
    /// In words: why the verdict (each counter past a threshold), or why health is not
    /// available.
    #[serde(default)]
    pub reasons: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<DiskProtocol>,
    /// The drive's own overall assessment (SMART overall-health / NVMe), if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// ATA 5 Reallocated_Sector_Ct; SCSI grown defect list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reallocated_sectors: Option<u64>,
    /// ATA 197 Current_Pending_Sector; SCSI pending defects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_sectors: Option<u64>,
    /// ATA 198 Offline_Uncorrectable (or 187 Reported_Uncorrect); SCSI total uncorrected
    /// read/write/verify errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncorrectable_sectors: Option<u64>,
    /// NVMe media and data integrity errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_errors: Option<u64>,
    /// ATA 199 UDMA_CRC_Error_Count: link (cable, backplane) errors, not the medium.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc_errors: Option<u64>,
    /// NVMe critical warning bits (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critical_warning: Option<u8>,
    /// NVMe endurance used, percent (may pass 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage_used: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_celsius: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_on_hours: Option<u64>,
    /// When it was read, seconds since the Unix epoch (0: never).
    #[serde(default)]
    pub checked: u64,
}

#[allow(clippy::derivable_impls)]
impl Default for HealthVerdict {
    fn default() -> HealthVerdict {
        HealthVerdict::Unavailable
    }
}

impl Health {
    /// Health that cannot be read, and why.
    pub fn unavailable(reason: impl Into<String>) -> Health {
        Health {
            verdict: HealthVerdict::Unavailable,
            reasons: vec![reason.into()],
            ..Health::default()
        }
    }

    /// One line: "ok", "warn: 12 reallocated sectors", "not available: a file".
    pub fn summary(&self) -> String {
        let why = self.reasons.join("; ");
        match (self.verdict, why.is_empty()) {
            (HealthVerdict::Unavailable, _) => format!("not available: {why}"),
            (v, true) => v.to_string(),
            (v, false) => format!("{v}: {why}"),
        }
    }
}

/// Where a member's disk sits: an enclosure (SES, through the kernel's ses driver) and its
/// slot, or an NVMe slot the platform exposes (/sys/bus/pci/slots).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Location {
    /// The enclosure's name in /sys/class/enclosure (its SCSI address, "0:0:12:0"), or
    /// "pci" for a PCIe (NVMe) slot.
    pub enclosure: String,
    /// The enclosure's own identifier (its logical id / WWN), when it gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enclosure_id: Option<String>,
    /// The slot as the enclosure names it ("Slot 03", "3").
    pub slot: String,
    /// The locate LED can be driven (sysfs `locate` or ledctl).
    #[serde(default)]
    pub led: bool,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.enclosure, self.slot)
    }
}

/// A stable name for a member's disk, the same after a reboot renames /dev/sdX.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The kernel's name now ("sdc", "nvme0n1").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_name: Option<String>,
    /// World wide name / NVMe EUI or NGUID (/sys/block/X/device/wwid, `wwid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A /dev/disk/by-id link to it (wwn- first, then others).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_id: Option<String>,
    /// Its physical drive holds another LUN too (a dual-actuator drive: one drive, two
    /// devices, one failure): the drive's key, the same for both halves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_drive: Option<String>,
    /// Independent access ranges (actuators) of this device, where it reports more than
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actuators: Option<u32>,
}

impl Identity {
    /// The most stable name known: WWN, else serial, else the by-id link.
    pub fn stable(&self) -> Option<&str> {
        self.wwn
            .as_deref()
            .or(self.serial.as_deref())
            .or(self.by_id.as_deref())
    }
}

/// The array's predictive failure policy (`sbod set NAME --health-policy ...`): each
/// counter's warning and failing thresholds (reached = past), and what a failing disk
/// calls for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthPolicy {
    pub reallocated: Threshold,
    pub pending: Threshold,
    pub uncorrectable: Threshold,
    pub media_errors: Threshold,
    /// Link errors: a cable or backplane, not the disk: warn only by default.
    pub crc_errors: Threshold,
    /// NVMe percentage used.
    pub percentage_used: Threshold,
    pub temperature: Threshold,
    /// A failing member is replaced proactively onto a hot spare (copied while it still
    /// serves: no window without redundancy). Without a spare: an event only, never a
    /// fault (a failing disk still serves better than no disk).
    pub replace: bool,
    /// A new disk that appears in a failed member's enclosure slot replaces it (ZFS's
    /// `autoreplace`); off by default: a disk put in a slot is not taken without asking.
    pub autoreplace: bool,
    /// Seconds between two readings in the serving process (smartd's default is 1800).
    pub interval_secs: u64,
    /// A member failed by I/O errors (writes, reads, flushes, its metadata) is tried again
    /// this many seconds after it failed, and taken back from the write-intent bitmap if it
    /// answers (Ceph's down-out interval: a cable pulled and pushed back, a controller
    /// reset); each try doubles the wait before the member's next. None (the default):
    /// it stays failed until the operator adds it back.
    pub rejoin_after_secs: Option<u64>,
}

/// Warn at or past `warn`, failing at or past `fail` (`None`: never).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Threshold {
    pub warn: Option<u64>,
    pub fail: Option<u64>,
}

impl Threshold {
    pub const fn new(warn: Option<u64>, fail: Option<u64>) -> Threshold {
        Threshold { warn, fail }
    }
}

impl Default for HealthPolicy {
    fn default() -> HealthPolicy {
        HealthPolicy {
            // Backblaze's drive stats: any reallocated, pending or uncorrectable sector
            // multiplies the failure rate; a handful more is a drive on its way out.
            reallocated: Threshold::new(Some(1), Some(100)),
            pending: Threshold::new(Some(1), Some(10)),
            uncorrectable: Threshold::new(Some(1), Some(10)),
            media_errors: Threshold::new(Some(1), Some(10)),
            crc_errors: Threshold::new(Some(100), None),
            percentage_used: Threshold::new(Some(90), Some(100)),
            temperature: Threshold::new(Some(60), Some(70)),
            replace: true,
            autoreplace: false,
            interval_secs: 1800,
            rejoin_after_secs: None,
        }
    }
}

impl HealthPolicy {
    /// The policy's knobs by name, for `--health-policy` and its display.
    pub const KNOBS: &'static [&'static str] = &[
        "reallocated",
        "pending",
        "uncorrectable",
        "media_errors",
        "crc_errors",
        "percentage_used",
        "temperature",
        "replace",
        "autoreplace",
        "interval",
        "rejoin_after",
    ];

    fn threshold_mut(&mut self, k: &str) -> Option<&mut Threshold> {
        Some(match k {
            "reallocated" => &mut self.reallocated,
            "pending" => &mut self.pending,
            "uncorrectable" => &mut self.uncorrectable,
            "media_errors" => &mut self.media_errors,
            "crc_errors" => &mut self.crc_errors,
            "percentage_used" => &mut self.percentage_used,
            "temperature" => &mut self.temperature,
            _ => return None,
        })
    }

    /// Apply `KEY=VALUE[,KEY=VALUE...]`: a threshold as `WARN:FAIL` (`-` for never, e.g.
    /// `reallocated=10:200`, `crc_errors=50:-`), `replace=on|off`, `interval=SECONDS`,
    /// `rejoin_after=SECONDS|off`, or the word `default` for the defaults.
    /// A refused spec changes nothing.
    pub fn apply(&mut self, spec: &str) -> Result<(), crate::ParseError> {
        let mut new = self.clone();
        new.apply_parts(spec)?;
        *self = new;
        Ok(())
    }

    fn apply_parts(&mut self, spec: &str) -> Result<(), crate::ParseError> {
        let bad = |m: String| crate::ParseError(m);
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "default" {
                *self = HealthPolicy::default();
                continue;
            }
            let (k, v) = part.split_once('=').ok_or_else(|| {
                bad(format!(
                    "'{part}': expected KEY=VALUE, KEY one of {}",
                    Self::KNOBS.join(", ")
                ))
            })?;
            let (k, v) = (k.trim(), v.trim());
            let onoff = |v: &str| match v {
                "on" | "yes" | "true" => Ok(true),
                "off" | "no" | "false" => Ok(false),
                _ => Err(bad(format!("{k}={v}: on or off"))),
            };
            match k {
                "replace" => self.replace = onoff(v)?,
                "autoreplace" => self.autoreplace = onoff(v)?,
                "rejoin_after" => {
                    self.rejoin_after_secs = match v {
                        "off" | "no" | "never" => None,
                        n => Some(
                            n.trim_end_matches('s')
                                .parse()
                                .ok()
                                .filter(|n| *n > 0)
                                .ok_or_else(|| {
                                    bad(format!("rejoin_after={v}: seconds above 0, or off"))
                                })?,
                        ),
                    }
                }
                "interval" => {
                    self.interval_secs = v
                        .trim_end_matches('s')
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad(format!("interval={v}: seconds, above 0")))?
                }
                _ => {
                    let t = self.threshold_mut(k).ok_or_else(|| {
                        bad(format!(
                            "unknown health policy key '{k}': one of {}",
                            Self::KNOBS.join(", ")
                        ))
                    })?;
                    let num = |s: &str| -> Result<Option<u64>, crate::ParseError> {
                        match s.trim() {
                            "-" | "never" | "" => Ok(None),
                            n => n.parse().map(Some).map_err(|_| {
                                bad(format!("{k}={v}: WARN:FAIL as numbers, '-' for never"))
                            }),
                        }
                    };
                    let (w, f) = v.split_once(':').unwrap_or((v, "-"));
                    let (w, f) = (num(w)?, num(f)?);
                    if let (Some(w), Some(f)) = (w, f) {
                        if w > f {
                            return Err(bad(format!(
                                "{k}={v}: the warning threshold is above the failing one"
                            )));
                        }
                    }
                    *t = Threshold::new(w, f);
                }
            }
        }
        Ok(())
    }

    /// In words, as `apply` reads it back.
    pub fn describe(&self) -> String {
        let t = |x: &Threshold| {
            let n = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            format!("{}:{}", n(x.warn), n(x.fail))
        };
        format!(
            "reallocated={},pending={},uncorrectable={},media_errors={},crc_errors={},percentage_used={},temperature={},replace={},autoreplace={},interval={},rejoin_after={}",
            t(&self.reallocated),
            t(&self.pending),
            t(&self.uncorrectable),
            t(&self.media_errors),
            t(&self.crc_errors),
            t(&self.percentage_used),
            t(&self.temperature),
            if self.replace { "on" } else { "off" },
            if self.autoreplace { "on" } else { "off" },
            self.interval_secs,
            self.rejoin_after_secs
                .map_or("off".to_string(), |s| s.to_string())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_reads_back_what_it_says() {
        let mut p = HealthPolicy::default();
        p.apply("reallocated=10:200, crc_errors=-:-,replace=off,autoreplace=on,interval=60")
            .unwrap();
        assert_eq!(p.rejoin_after_secs, None, "off by default");
        p.apply("rejoin_after=30").unwrap();
        assert_eq!(p.rejoin_after_secs, Some(30));
        assert!(p.apply("rejoin_after=0").is_err());
        assert!(p.apply("rejoin_after=soon").is_err());
        assert!(p.autoreplace);
        assert_eq!(p.reallocated, Threshold::new(Some(10), Some(200)));
        assert_eq!(p.crc_errors, Threshold::new(None, None));
        assert!(!p.replace);
        assert_eq!(p.interval_secs, 60);
        let mut q = HealthPolicy::default();
        q.apply(&p.describe()).unwrap();
        assert_eq!(p, q);
        q.apply("default").unwrap();
        assert_eq!(q, HealthPolicy::default());
    }

    #[test]
    fn policy_refuses_nonsense() {
        let mut p = HealthPolicy::default();
        for bad in [
            "reallocated",
            "speed=3",
            "pending=a:b",
            "pending=10:5",
            "pending=3:4,replace=maybe",
            "interval=0",
        ] {
            let e = p.apply(bad).unwrap_err();
            assert!(!e.0.is_empty(), "{bad}");
        }
        assert_eq!(p, HealthPolicy::default(), "a refused spec changes nothing");
    }

    #[test]
    fn old_status_without_health_reads() {
        let h: Health = serde_json::from_str("{\"verdict\":\"ok\"}").unwrap();
        assert_eq!(h.verdict, HealthVerdict::Ok);
        assert_eq!(
            Health::unavailable("a file").summary(),
            "not available: a file"
        );
    }
}
