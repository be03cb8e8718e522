//! Drive profiles: the datasheet figures a modelled drive answers by.
//!
//! Each built-in profile names its sources (docs/LAB.md, "Modelled drives", has the table
//! with the links). Where a datasheet does not give a figure the model needs (full-stroke
//! seek, the inner-zone rate, command overhead), the value is the class's usual one and
//! is marked so here.

/// A hard disk: one spindle, one or more actuators.
#[derive(Clone, Debug, PartialEq)]
pub struct Hdd {
    /// Bytes of the whole drive.
    pub capacity: u64,
    pub rpm: f64,
    /// Average seek (read), over all seek lengths, in ms.
    pub seek_avg_ms: f64,
    /// Full-stroke seek, ms.
    pub seek_full_ms: f64,
    /// Track-to-track seek, ms.
    pub seek_track_ms: f64,
    /// Extra settle time before a write, ms.
    pub write_settle_ms: f64,
    /// Sustained media rate of the whole drive (all actuators) at the outer and the inner
    /// diameter, MB/s (10^6 bytes).
    pub outer_mbps: f64,
    pub inner_mbps: f64,
    /// Independent actuators (2 for dual-actuator drives): each serves an equal share of
    /// the LBAs (the first half to the first one), with its own heads and queue.
    pub actuators: u32,
    /// Commands the drive queues and reorders (NCQ/TCQ); 1 turns queueing off.
    pub queue_depth: u32,
    /// Bytes of the cache the model lets hold written, not yet destaged, data.
    pub write_cache_bytes: u64,
    /// Write cache enabled (writes complete once in the cache; FLUSH destages them).
    pub write_cache: bool,
    /// Read-ahead: bytes the drive keeps reading past a read while it has nothing else to do.
    pub read_ahead_bytes: u64,
    /// Per-command overhead of the drive's controller, µs.
    pub command_us: f64,
    /// Fixed cost of a FLUSH beyond destaging, µs.
    pub flush_us: f64,
    /// The drive's own link (SATA 6 Gb/s, SAS 12 Gb/s), MB/s.
    pub interface_mbps: f64,
    /// Scheduling: shortest positioning time first (true), or arrival order.
    pub sptf: bool,
}

/// A solid-state drive: ceilings of its class, no mechanics.
#[derive(Clone, Debug, PartialEq)]
pub struct Ssd {
    pub capacity: u64,
    /// 4 KiB random IOPS ceilings.
    pub read_iops: f64,
    pub write_iops: f64,
    /// Sequential bandwidth ceilings, MB/s.
    pub read_mbps: f64,
    pub write_mbps: f64,
    /// Latency of one 4 KiB command at queue depth 1, µs.
    pub read_us: f64,
    pub write_us: f64,
    /// Cost of a FLUSH, µs (drives with power-loss protection answer at once).
    pub flush_us: f64,
    pub queue_depth: u32,
    /// The drive's own link, MB/s.
    pub interface_mbps: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Profile {
    Hdd(Hdd),
    Ssd(Ssd),
}

/// The built-in profiles: (name, what it models).
pub const NAMES: &[(&str, &str)] = &[
    (
        "hdd-nearline",
        "20 TB 7200 rpm nearline HDD (Toshiba MG10 20 TB class: 281 MB/s outer, 512 MiB cache)",
    ),
    (
        "hdd-nearline-sas",
        "the same HDD on SAS 12 Gb/s with the write cache off (as SAS drives ship)",
    ),
    (
        "hdd-dual",
        "14 TB 7200 rpm dual-actuator HDD (Seagate Exos 2X14 class: 524 MB/s outer)",
    ),
    (
        "nvme-dc",
        "datacenter NVMe SSD, PCIe 4.0 x4 (Samsung PM9A3 U.2 class: 6.5/3.5 GB/s, 900K/200K IOPS)",
    ),
];

const TB: u64 = 1_000_000_000_000;

/// The 20 TB nearline HDD. Sources: Toshiba MG10 20 TB (MG10ACA20TE/MG10SCA20TE): 7200 rpm,
/// 281 MB/s maximum sustained transfer rate, 512 MiB buffer; average seek 8.2 ms (read)
/// as HGST's Ultrastar 7K4000 specification gives for the 7200 rpm nearline class (Toshiba
/// does not publish seeks). Class values (not from a datasheet): 16 ms full stroke, 0.6 ms
/// track to track, inner diameter at 47% of the outer rate, 40 µs command overhead,
/// 32 MiB of the cache used for writes, 2 MiB read-ahead.
pub fn hdd_nearline() -> Hdd {
    Hdd {
        capacity: 20 * TB,
        rpm: 7200.0,
        seek_avg_ms: 8.2,
        seek_full_ms: 16.0,
        seek_track_ms: 0.6,
        write_settle_ms: 0.0,
        outer_mbps: 281.0,
        inner_mbps: 132.0,
        actuators: 1,
        queue_depth: 32,
        write_cache_bytes: 32 << 20,
        write_cache: true,
        read_ahead_bytes: 2 << 20,
        command_us: 40.0,
        flush_us: 100.0,
        interface_mbps: 600.0,
        sptf: true,
    }
}

/// Look a profile up by name, with options applied (see [`crate::spec`]).
pub fn by_name(name: &str) -> Option<Profile> {
    Some(match name {
        "hdd-nearline" => Profile::Hdd(hdd_nearline()),
        "hdd-nearline-sas" => Profile::Hdd(Hdd {
            write_cache: false,
            queue_depth: 64,
            interface_mbps: 1200.0,
            ..hdd_nearline()
        }),
        // Seagate Exos 2X14 (Mach.2): 14 TB as two 7 TB halves, each with its own actuator,
        // 7200 rpm, 524 MB/s sustained at the outer diameter, 256 MB cache, SAS 12 Gb/s,
        // 4.16 ms average latency (half a revolution at 7200 rpm), 304 / 384 random read /
        // write IOPS. Seeks and the inner rate as the nearline class above.
        "hdd-dual" => Profile::Hdd(Hdd {
            capacity: 14 * TB,
            outer_mbps: 524.0,
            inner_mbps: 246.0,
            actuators: 2,
            queue_depth: 64,
            interface_mbps: 1200.0,
            ..hdd_nearline()
        }),
        // Samsung PM9A3 U.2 (PCIe 4.0 x4): up to 6,500 MB/s sequential read, 3,500 MB/s
        // write, 900K / 200K random read / write IOPS (7.68 TB). Class values: 80 µs read and
        // 20 µs write latency at QD1, flush at once (power-loss protection).
        "nvme-dc" => Profile::Ssd(Ssd {
            capacity: 7_680_000_000_000,
            read_iops: 900_000.0,
            write_iops: 200_000.0,
            read_mbps: 6500.0,
            write_mbps: 3500.0,
            read_us: 80.0,
            write_us: 20.0,
            flush_us: 5.0,
            queue_depth: 1024,
            interface_mbps: 7000.0,
        }),
        _ => return None,
    })
}

impl Hdd {
    /// Refuse figures the model cannot work with.
    pub fn check(&self) -> Result<(), String> {
        let pos = |v: f64, what: &str| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{what} must be above 0 (got {v})"))
            }
        };
        pos(self.rpm, "rpm")?;
        pos(self.outer_mbps, "the outer rate")?;
        pos(self.inner_mbps, "the inner rate")?;
        pos(self.interface_mbps, "the interface rate")?;
        if self.inner_mbps > self.outer_mbps {
            return Err("the inner rate must not exceed the outer rate".into());
        }
        if !(self.seek_track_ms <= self.seek_avg_ms && self.seek_avg_ms <= self.seek_full_ms) {
            return Err("seeks must be track-to-track <= average <= full stroke".into());
        }
        if self.actuators == 0 || self.queue_depth == 0 || self.capacity == 0 {
            return Err("actuators, queue depth and capacity must be at least 1".into());
        }
        Ok(())
    }
}

impl Profile {
    pub fn capacity(&self) -> u64 {
        match self {
            Profile::Hdd(h) => h.capacity,
            Profile::Ssd(s) => s.capacity,
        }
    }
}
