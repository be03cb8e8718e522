//! The engine's tuning knobs, in one place: environment variables for A/B benchmarks and
//! tests, each read once per process, with its default, range and meaning. None changes
//! what is stored or what a read returns; each changes only how the engine's work is
//! batched or queued. docs/ENGINE.md ("Tuning knobs") lists them in one table, and
//! [`knobs`] gives their current values (for status output).
//!
//! A setting a person chooses per array (sync mode, checksums, bitmap region...) is in
//! the array's settings and its superblock, not here.

use std::sync::OnceLock;
use std::time::Duration;

/// One knob: its variable, default, range and meaning, and the value in force.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Knob {
    pub name: &'static str,
    pub default: &'static str,
    pub range: &'static str,
    pub meaning: &'static str,
    /// The value this process runs with (the default unless the variable sets another).
    pub value: String,
}

/// How long a partial stripe at the edge of a large write waits for the neighbouring
/// write that completes it (write coalescing, `family/parity/coalesce.rs`).
pub const COALESCE_WAIT: &str = "SBOD_GATHER_US";

/// How many of the recent large writes' average latency a partial stripe waits for its
/// neighbour (at least `SBOD_GATHER_US`; default [`COALESCE_LATENCIES_DEFAULT`]), for A/B
/// benchmarks.
pub const COALESCE_LATENCIES: &str = "SBOD_GATHER_LATENCIES";
/// Default of [`COALESCE_LATENCIES`].
pub const COALESCE_LATENCIES_DEFAULT: u32 = 4;
/// Batch member requests issued on one thread into one wake-up of each member's queue.
pub const PLUG: &str = "SBOD_PLUG";
/// Merge neighbouring requests into one I/O on io_uring members.
pub const URING_MERGE: &str = "SBOD_URING_MERGE";
/// Force a member queue backend for every member the process opens.
pub const IO_BACKEND: &str = "SBOD_IO";
/// Bytes of checksum tags each member keeps cached.
pub const TAG_CACHE: &str = "SBOD_TAG_CACHE";

/// Member space the write-intent bitmap sets dirty ahead of a writer moving forward, in
/// the same write as the bit it waits for (`Bitmap::ahead_locked`).
pub const BITMAP_AHEAD: &str = "SBOD_BITMAP_AHEAD";
/// Default of [`BITMAP_AHEAD`]: 16 MiB (16 regions of a 1 GiB member's 1 MiB, one of the
/// 128 MiB a large member gets).
pub const BITMAP_AHEAD_DEFAULT: u64 = 16 << 20;

/// Windows of rows a declustered layout's distributed rebuild or copy-back keeps under way.
pub const DECL_WINDOWS: &str = "SBOD_DECL_WINDOWS";
/// A declustered transition's chunks in flight on one member while clients are busy.
pub const DECL_ROOM: &str = "SBOD_DECL_ROOM";
/// Memory a declustered transition may hold in members' runs read ahead.
pub const DECL_RUNS: &str = "SBOD_DECL_RUNS";

/// The row height (rows per permutation) a declustered array is created with, in place
/// of the one chosen from its member size (`Declustered::height_for`). Read at create
/// only: the height is recorded in the superblocks.
pub const DECL_HEIGHT: &str = "SBOD_DECL_HEIGHT";

/// Default of [`DECL_WINDOWS`].
pub const DECL_WINDOWS_DEFAULT: usize = 2;
/// Default of [`DECL_ROOM`].
pub const DECL_ROOM_DEFAULT: usize = 4;
/// Default of [`DECL_RUNS`]: 1 GiB (25 blocks of 8+2 groups reading their eight 4 MiB
/// runs at once; a block gives back its runs' share once rebuilt).
pub const DECL_RUNS_DEFAULT: u64 = 1 << 30;

/// Default of [`COALESCE_WAIT`], in microseconds.
pub const COALESCE_WAIT_DEFAULT_US: u64 = 1000;
/// Default of [`TAG_CACHE`]: 16 MiB of tags per member, the tags of 16 GiB of its data.
pub const TAG_CACHE_DEFAULT: u64 = 16 << 20;

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `0` turns it off; anything else (or nothing) leaves it on.
fn on_unless_zero(name: &str) -> bool {
    var(name).is_none_or(|v| v != "0")
}

/// How long write coalescing waits (zero: it is off). Unparsable values give the default.
pub fn coalesce_wait() -> Duration {
    static V: OnceLock<Duration> = OnceLock::new();
    *V.get_or_init(|| {
        let us = var(COALESCE_WAIT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(COALESCE_WAIT_DEFAULT_US);
        Duration::from_micros(us)
    })
}

/// How many average latencies coalescing waits ([`COALESCE_LATENCIES`]).
pub fn coalesce_latencies() -> u32 {
    static V: OnceLock<u32> = OnceLock::new();
    *V.get_or_init(|| {
        var(COALESCE_LATENCIES)
            .and_then(|v| v.parse().ok())
            .unwrap_or(COALESCE_LATENCIES_DEFAULT)
    })
}

/// Whether plugging batches a thread's member requests.
pub fn plug() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| on_unless_zero(PLUG))
}

/// Whether io_uring members merge neighbouring requests.
pub fn uring_merge() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| on_unless_zero(URING_MERGE))
}

/// The member backend forced for every member: `uring`, `threads` or `inline` (lower
/// case), none when unset or empty, or what is wrong with the value (an error at every
/// member open, never a silent fallback).
pub fn io_backend() -> Result<Option<&'static str>, String> {
    static V: OnceLock<Result<Option<&'static str>, String>> = OnceLock::new();
    V.get_or_init(|| match std::env::var(IO_BACKEND) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => ["uring", "threads", "inline"]
            .into_iter()
            .find(|b| v.eq_ignore_ascii_case(b))
            .map(Some)
            .ok_or_else(|| {
                format!("{IO_BACKEND}={v}: expected \"uring\", \"threads\" or \"inline\"")
            }),
        Err(e) => Err(format!("{IO_BACKEND}: {e}")),
    })
    .clone()
}

/// Bytes of tags each member may keep cached (sizes as `16M`, `1G` or bytes; unparsable
/// values give the default).
pub fn tag_cache_bytes() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        var(TAG_CACHE)
            .and_then(|v| sbod_types::parse_size(&v).ok())
            .unwrap_or(TAG_CACHE_DEFAULT)
    })
}

/// Bytes of member space set dirty ahead of a writer moving forward ([`BITMAP_AHEAD`]; 0:
/// none). Unparsable values give the default.
pub fn bitmap_ahead_bytes() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        var(BITMAP_AHEAD)
            .and_then(|v| sbod_types::parse_size(&v).ok())
            .unwrap_or(BITMAP_AHEAD_DEFAULT)
    })
}

/// Windows of rows a declustered transition keeps under way (1: one at a time, each
/// window's chunks all written before the next one's are read). Out of range or
/// unparsable values give the default.
pub fn decl_windows() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| {
        var(DECL_WINDOWS)
            .and_then(|v| v.parse().ok())
            .filter(|n| (1..=8).contains(n))
            .unwrap_or(DECL_WINDOWS_DEFAULT)
    })
}

/// The row height [`DECL_HEIGHT`] asks new declustered arrays for (None: chosen from the
/// member size). Values outside 1 to 65536 or not powers of two are ignored.
pub fn decl_height() -> Option<u32> {
    var(DECL_HEIGHT)
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|n| n.is_power_of_two() && *n <= 1 << 16)
}

/// A declustered transition's chunks that may touch one member at once while clients are
/// busy (0: no limit). Unparsable values give the default.
pub fn decl_room() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| {
        var(DECL_ROOM)
            .and_then(|v| v.parse().ok())
            .unwrap_or(DECL_ROOM_DEFAULT)
    })
}

/// Bytes a declustered transition may hold in members' runs read ahead (each member's
/// run of a block read as one request, the block's chunks rebuilt from them; 0: chunk by
/// chunk, each chunk's stripe read on its own). Unparsable values give the default.
pub fn decl_runs_bytes() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        var(DECL_RUNS)
            .and_then(|v| sbod_types::parse_size(&v).ok())
            .unwrap_or(DECL_RUNS_DEFAULT)
    })
}

/// Every knob with the value in force, in the order of docs/ENGINE.md's table.
pub fn knobs() -> Vec<Knob> {
    vec![
        Knob {
            name: COALESCE_WAIT,
            default: "1000",
            range: "microseconds, 0 (off) and up",
            meaning: "how long a partial stripe at the edge of a write of 32 KiB or more waits \
                      for the neighbouring write that completes it (write coalescing, parity \
                      levels)",
            value: coalesce_wait().as_micros().to_string(),
        },
        Knob {
            name: PLUG,
            default: "1",
            range: "0 (off) or 1",
            meaning: "batch the member requests of one client request into one wake-up of \
                      each member's queue",
            value: u8::from(plug()).to_string(),
        },
        Knob {
            name: URING_MERGE,
            default: "1",
            range: "0 (off) or 1",
            meaning: "merge neighbouring requests into one I/O on io_uring members (at most \
                      2 MiB, 64 requests)",
            value: u8::from(uring_merge()).to_string(),
        },
        Knob {
            name: IO_BACKEND,
            default: "(chosen per member)",
            range: "uring, threads or inline",
            meaning: "force one member queue for every member this process opens (a forced \
                      backend that cannot be set up is an error)",
            value: match io_backend() {
                Ok(Some(b)) => b.to_string(),
                Ok(None) => "(chosen per member)".to_string(),
                Err(e) => format!("invalid: {e}"),
            },
        },
        Knob {
            name: TAG_CACHE,
            default: "16M",
            range: "a size, per member (at least 16 tag blocks: 64 KiB)",
            meaning: "checksum tags each member keeps cached (16 MiB covers 16 GiB of its \
                      data)",
            value: tag_cache_bytes().to_string(),
        },
        Knob {
            name: BITMAP_AHEAD,
            default: "16M",
            range: "a size, 0 (off) and up",
            meaning: "member space the write-intent bitmap sets dirty ahead of a writer moving \
                      forward (the region before the one it enters is dirty), in the same write \
                      as the bit it waits for: one wait per that much instead of per region; at \
                      least one region, at most 16 (a crash resyncs that much more)",
            value: bitmap_ahead_bytes().to_string(),
        },
        Knob {
            name: DECL_WINDOWS,
            default: "2",
            range: "1 to 8",
            meaning: "windows of rows a declustered layout's distributed rebuild or copy-back \
                      keeps under way (the next one's reads while the last one's writes \
                      finish; the boundary still moves in order); 1: one at a time",
            value: decl_windows().to_string(),
        },
        Knob {
            name: DECL_ROOM,
            default: "4",
            range: "0 (no limit) and up",
            meaning: "a declustered transition's chunks that may touch one member at once \
                      while clients are busy (the rest of the member's queue is theirs)",
            value: decl_room().to_string(),
        },
        Knob {
            name: DECL_RUNS,
            default: "1G",
            range: "a size, 0 (off) and up",
            meaning: "memory a declustered layout's distributed rebuild or copy-back may hold \
                      in runs read ahead (each member's run of a block read as one request \
                      while clients are idle, the chunks rebuilt from the runs; no more than \
                      keeps 4 runs queued a member); 0: chunk by chunk",
            value: decl_runs_bytes().to_string(),
        },
    ]
}
