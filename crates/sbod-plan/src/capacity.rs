//! Capacity: raw, less hot spares, less redundancy, at the fill limit; in TB and TiB.

use serde::Serialize;

use crate::units::{TB, TIB};

/// How TiB figures are derived from the disk size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TibConvention {
    /// Exact: bytes / 2^40 (a 20 TB disk is 18.19 TiB).
    #[default]
    Exact,
    /// Each disk counted as its label's TiB, rounded to 0.1 TiB (a 20 TB disk is 18.2 TiB),
    /// as vendors' storage calculators do; TB figures are unaffected.
    Label,
}

/// One capacity figure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Size {
    /// In disks' worth (48 for 48 disks of data).
    pub disks: f64,
    pub bytes: u64,
    /// Vendor terabytes, 10^12 bytes.
    pub tb: f64,
    /// Tebibytes, 2^40 bytes (or label TiB, see [`TibConvention`]).
    pub tib: f64,
}

/// Capacity of a layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capacity {
    pub disk_tb: f64,
    pub disk_tib: f64,
    pub tib_convention: TibConvention,
    /// All disks.
    pub raw: Size,
    /// Hot spares.
    pub spares: Size,
    /// Raw capacity of the disks in redundancy groups.
    pub after_spares: Size,
    /// Parity or extra copies.
    pub redundancy: Size,
    /// Usable capacity: after spares and redundancy.
    pub usable: Size,
    /// The fraction of usable capacity one plans to fill (0.9).
    pub fill_limit: f64,
    /// Usable capacity at the fill limit.
    pub at_fill_limit: Size,
    /// `usable / raw`.
    pub efficiency: f64,
}

impl Capacity {
    /// Capacity of `data`, `redundancy` and `spares` disks' worth of `disk_bytes` disks.
    pub fn new(
        disk_bytes: u64,
        data: u32,
        redundancy: u32,
        spares: u32,
        fill_limit: f64,
        tib: TibConvention,
    ) -> Capacity {
        let disk_tib = match tib {
            TibConvention::Exact => disk_bytes as f64 / TIB,
            TibConvention::Label => (disk_bytes as f64 / TIB * 10.0).round() / 10.0,
        };
        let size = |disks: f64| Size {
            disks,
            // Exact in u128 for whole disks; the fill limit is a fraction anyway.
            bytes: if disks.fract() == 0.0 {
                (disks as u128 * disk_bytes as u128).min(u64::MAX as u128) as u64
            } else {
                (disks * disk_bytes as f64).floor() as u64
            },
            tb: disks * disk_bytes as f64 / TB,
            // Label TiB as a whole number of tenths keeps 48 x 18.2 at 873.6 exactly.
            tib: match tib {
                TibConvention::Exact => disks * disk_tib,
                TibConvention::Label => disks * (disk_tib * 10.0).round() / 10.0,
            },
        };
        let data = data as f64;
        let members = data + redundancy as f64;
        let all = members + spares as f64;
        Capacity {
            disk_tb: disk_bytes as f64 / TB,
            disk_tib,
            tib_convention: tib,
            raw: size(all),
            spares: size(spares as f64),
            after_spares: size(members),
            redundancy: size(redundancy as f64),
            usable: size(data),
            fill_limit,
            at_fill_limit: size(data * fill_limit),
            efficiency: data / all,
        }
    }
}
