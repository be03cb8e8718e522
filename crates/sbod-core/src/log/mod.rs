//! The log device: md's journal (raid5-cache), ZFS's separate intent log.
//!
//! A record is the list of member writes a stripe write was planned into: every data and
//! parity chunk (or mirror copy) it writes, with their bytes. The engine appends the
//! record, and once [`Log::append`] returns, the record is durable on every log device in
//! service and so is every record before it; the engine then writes the members in place
//! (without FUA: the log already holds the bytes) and calls [`Ticket::applied`]. A record
//! stays in the ring until a checkpoint has flushed the pool after it was applied; then the
//! log's tail advances past it and its space is reused.
//!
//! After a crash, [`scan`] reads the whole ring and finds every valid record of the
//! session from the tail on, in sequence order; replaying them (writing each entry to its
//! member) is idempotent, and makes every stripe that was being written consistent again,
//! whichever of its member writes had landed: the write hole closes.
//!
//! A record can be damaged on the log after it was acknowledged (a flipped bit, a bad
//! sector). The records after it were acknowledged too, and may be in the pool already:
//! replaying only the records before the damage would write their older bytes over newer
//! ones. So replay never stops at damage: [`Scan::plan`] replays every valid record in
//! sequence order, and for each damaged one proves that newer records rewrite its blocks,
//! or that the pool holds its writes (its payload checksum over the pool's bytes), and
//! then keeps those blocks as the pool has them; a damaged record that a later record
//! vouches was durable (each header says which records before it were durable) and that
//! neither proof covers is lost: the engine refuses to start unless forced, and says
//! which record and member ranges (`array/log.rs`). A damaged record nothing vouches for is an
//! append a crash tore: never acknowledged, left out. A mirrored log's devices stand in
//! for each other record by record.
//!
//! Two devices make a mirrored log: every record goes to both, and is durable once both
//! have it. A device that fails is recorded as failed by the array ([`LogHost`]) before
//! any record is acknowledged on the other alone; if both fail, appends fail and the
//! engine takes the in-pool path.
//!
//! Ordering: records are acknowledged in sequence order (a record waits for every earlier
//! one to be durable), and execution of a record's member writes starts only once it is
//! acknowledged; so a record no later header vouches for was never applied to the pool
//! unless it is one of the last few appended (those in flight together), whose damage on
//! a single log device cannot be told from a tear (a mirrored log covers them).
//!
//! Hand-written: this is the product's core (its I/O path), with a format of its own.

pub mod format;
pub mod slot;

use crate::buf::{AlignedBuf, SharedBuf};
use crate::dev::{self, BlockDev, BoxFut, IoClass};
use format::{Entry, Header, LogSuper, BLOCK, RING_START, SAME_DATA, ZERO};
use parking_lot::{Mutex, RwLock};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use uuid::Uuid;

/// A log device, opened.
#[derive(Clone)]
pub struct LogDevice {
    pub dev: Arc<dyn BlockDev>,
    pub uuid: Uuid,
    pub path: String,
}

/// What one member write of a record carries.
#[derive(Clone, Debug)]
pub enum Data {
    Bytes(SharedBuf),
    /// `len` bytes of zeros.
    Zero(u32),
}

/// One member write: `data` at `offset` of slot `slot`'s data area.
#[derive(Clone, Debug)]
pub struct Write {
    pub slot: u32,
    pub offset: u64,
    pub data: Data,
}

/// What the log needs from the array that owns it.
pub trait LogHost: Send + Sync {
    /// Make every member write that completed before this call durable (flush the pool).
    fn flush_pool(&self) -> BoxFut<io::Result<()>>;
    /// A log device failed: record it (on the members) before this returns. Records are
    /// then acknowledged on the other device alone.
    fn device_failed(&self, uuid: Uuid, error: String) -> BoxFut<()>;
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LogError {
    /// Every log device is out: take the in-pool path.
    #[error("the log has failed: {0}")]
    Failed(String),
    /// The record does not fit the ring (write it in pieces, or in the pool).
    #[error("a record of {0} bytes does not fit the log")]
    TooBig(u64),
    #[error("the log is closed")]
    Closed,
    #[error("{0}")]
    Io(String),
}

const ACTIVE: u8 = 0;
const FAILING: u8 = 1;
const FAILED: u8 = 2;

struct DevRt {
    d: LogDevice,
    state: AtomicU8,
    write_errors: AtomicU64,
    reason: Mutex<Option<String>>,
    /// Serialises recording its failure.
    failing: tokio::sync::Mutex<()>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Writing,
    Durable,
    Applied,
}

struct Live {
    seq: u64,
    off: u64,
    len: u64,
    state: St,
}

struct Ring {
    nonce: u64,
    generation: u64,
    next_seq: u64,
    /// Where the last record placed ends.
    head: u64,
    /// Records not yet reclaimed, oldest first.
    live: VecDeque<Live>,
    /// Every record with a smaller sequence number is durable.
    durable_upto: u64,
    /// The highest `durable_upto` a record's header carries (records below it are
    /// vouched for on the log).
    vouched_upto: u64,
    failed: Option<String>,
    /// New appends wait (a device is being added).
    paused: bool,
    closed: bool,
}

impl Ring {
    /// Where a record of `len` bytes (at most the ring) goes, if it fits now. A record is
    /// never split: one that does not fit before the end of the ring goes to its start.
    fn place(&self, len: u64, ring_len: u64) -> Option<u64> {
        let head = self.head;
        let (Some(front), Some(back)) = (self.live.front(), self.live.back()) else {
            return Some(if head + len <= ring_len { head } else { 0 });
        };
        let tail = front.off;
        if back.off >= tail {
            // Occupied: [tail, head). Free: [head, end) and [0, tail).
            if head + len <= ring_len {
                Some(head)
            } else if len <= tail {
                Some(0)
            } else {
                None
            }
        } else {
            // Occupied: [tail, end) and [0, head). Free: [head, tail).
            (head + len <= tail).then_some(head)
        }
    }

    /// Where the next record would start if nothing wraps (a superblock's tail).
    fn next_off(&self, ring_len: u64) -> u64 {
        if self.head >= ring_len {
            0
        } else {
            self.head
        }
    }

    fn used(&self) -> u64 {
        self.live.iter().map(|l| l.len).sum()
    }

    fn index(&self, seq: u64) -> Option<usize> {
        let first = self.live.front()?.seq;
        let i = seq.checked_sub(first)? as usize;
        (i < self.live.len()).then_some(i)
    }

    fn set(&mut self, seq: u64, st: St) {
        if let Some(i) = self.index(seq) {
            self.live[i].state = st;
        }
    }

    /// Move `durable_upto` past every record durable in sequence.
    fn advance(&mut self) {
        while let Some(i) = self.index(self.durable_upto) {
            if self.live[i].state == St::Writing {
                break;
            }
            self.durable_upto += 1;
        }
    }
}

/// The log of a running array.
pub struct Log {
    me: std::sync::Weak<Log>,
    array_uuid: Uuid,
    ring_len: u64,
    devs: RwLock<Vec<Arc<DevRt>>>,
    ring: Mutex<Ring>,
    /// Woken when a record becomes durable or applied, space is freed, or the log fails.
    changed: tokio::sync::Notify,
    ckpt: tokio::sync::Mutex<()>,
    ckpt_running: AtomicBool,
    host: Arc<dyn LogHost>,
    records: AtomicU64,
    bytes: AtomicU64,
    checkpoints: AtomicU64,
    abandoned: AtomicU64,
}

/// A record appended and durable. Call [`Ticket::applied`] once its member writes have
/// completed (whatever their outcome: a member that failed them is the array's business).
#[must_use = "the record's space is reclaimed only once it is applied"]
pub struct Ticket {
    log: Arc<Log>,
    seq: u64,
    done: bool,
}

impl Ticket {
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The record's member writes have completed (not necessarily durably).
    pub fn applied(mut self) {
        self.done = true;
        self.log.applied(self.seq);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            // The engine dropped a write between logging and applying it: count it (a
            // checkpoint may pass the record once the rest is applied).
            self.log.abandoned.fetch_add(1, Relaxed);
            tracing::error!(
                seq = self.seq,
                "a log record was dropped before it was applied"
            );
            self.log.applied(self.seq);
        }
    }
}

/// A log device's state, for status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevInfo {
    pub uuid: Uuid,
    pub path: String,
    pub active: bool,
    pub reason: Option<String>,
    pub write_errors: u64,
}

/// What the log holds and did, for status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogInfo {
    pub capacity: u64,
    pub used: u64,
    pub live_records: u64,
    pub records: u64,
    pub bytes: u64,
    pub checkpoints: u64,
    pub abandoned: u64,
    pub failed: Option<String>,
    pub devices: Vec<DevInfo>,
}

/// The ring of a device of `size` bytes.
pub fn ring_len_for(size: u64) -> u64 {
    size.saturating_sub(RING_START) / BLOCK as u64 * BLOCK as u64
}

fn io_err(what: String) -> impl FnOnce(io::Error) -> LogError {
    move |e| LogError::Io(format!("{what}: {e}"))
}

async fn read_exact(dev: &Arc<dyn BlockDev>, off: u64, len: usize) -> io::Result<AlignedBuf> {
    let buf = AlignedBuf::for_overwrite(len).into_shared();
    dev::read_at(dev, off, buf.clone(), IoClass::Foreground).await?;
    Ok(buf.try_unwrap().expect("sole owner"))
}

/// Read a device's log superblock.
pub async fn read_super(dev: &Arc<dyn BlockDev>) -> Result<LogSuper, String> {
    if dev.size() < RING_START + format::MIN_RING {
        return Err(format!("{} is too small to be a log device", dev.name()));
    }
    let area = read_exact(dev, 0, 2 * BLOCK)
        .await
        .map_err(|e| format!("reading {}: {e}", dev.name()))?;
    LogSuper::decode_area(&area).map_err(|e| format!("{}: {e}", dev.name()))
}

async fn write_super(dev: &Arc<dyn BlockDev>, sb: &LogSuper) -> io::Result<()> {
    let buf = AlignedBuf::from_slice(&sb.encode()).into_shared();
    dev::write_at(dev, sb.copy_offset(), buf, true, IoClass::Foreground).await
}

/// Make `dev` an empty log device of the array (both superblock copies written).
pub async fn format(dev: &LogDevice, array_uuid: Uuid) -> Result<LogSuper, LogError> {
    let ring_len = ring_len_for(dev.dev.size());
    if ring_len < format::MIN_RING {
        return Err(LogError::Io(format!(
            "{} is too small for a log: it needs at least {} bytes",
            dev.path,
            RING_START + format::MIN_RING
        )));
    }
    let mut sb = LogSuper {
        array_uuid,
        log_uuid: dev.uuid,
        generation: 0,
        nonce: Uuid::new_v4().as_u64_pair().0,
        tail_seq: 1,
        tail_off: 0,
        ring_len,
    };
    for g in [1, 2] {
        sb.generation = g;
        write_super(&dev.dev, &sb).await.map_err(io_err(format!(
            "writing the log superblock of {}",
            dev.path
        )))?;
    }
    Ok(sb)
}

/// A record read back: its header and payload.
pub struct Record {
    pub header: Header,
    pub payload: AlignedBuf,
}

impl Record {
    /// Its member writes: each entry with its bytes (`None`: zeros).
    pub fn writes(&self) -> Vec<(Entry, Option<&[u8]>)> {
        let mut out: Vec<(Entry, Option<&[u8]>)> = Vec::new();
        let mut pos = 0;
        for e in &self.header.entries {
            let data = if e.flags & ZERO != 0 {
                None
            } else if e.flags & SAME_DATA != 0 {
                out.last().and_then(|(_, d)| *d)
            } else {
                let d = &self.payload[pos..pos + e.len as usize];
                pos += e.len as usize;
                Some(d)
            };
            out.push((*e, data));
        }
        out
    }
}

/// Read the record of session `nonce` at ring offset `off` with sequence `seq`, or why
/// there is none.
async fn read_record(
    dev: &Arc<dyn BlockDev>,
    ring_len: u64,
    nonce: u64,
    off: u64,
    seq: u64,
) -> Result<Record, String> {
    if off + BLOCK as u64 > ring_len {
        return Err("end of the ring".into());
    }
    let first = read_exact(dev, RING_START + off, BLOCK)
        .await
        .map_err(|e| format!("read error: {e}"))?;
    let hl = format::header_len_of(&first).ok_or("no record")?;
    if off + hl as u64 > ring_len {
        return Err("header past the end of the ring".into());
    }
    let hbuf = if hl > BLOCK {
        read_exact(dev, RING_START + off, hl)
            .await
            .map_err(|e| format!("read error: {e}"))?
    } else {
        first
    };
    let h = format::decode_header(&hbuf)?;
    if h.nonce != nonce {
        return Err("a record of an earlier session".into());
    }
    if h.seq != seq || h.off != off {
        return Err(format!(
            "a record of an earlier pass (sequence {}, expected {seq})",
            h.seq
        ));
    }
    read_payload(dev, ring_len, h).await
}

/// Read and check the payload of the record whose header is `h`.
async fn read_payload(dev: &Arc<dyn BlockDev>, ring_len: u64, h: Header) -> Result<Record, String> {
    if h.off + h.total_len > ring_len {
        return Err("record past the end of the ring".into());
    }
    let hl = h.header_len as u64;
    let plen = (h.total_len - hl) as usize;
    let payload = if plen > 0 {
        read_exact(dev, RING_START + h.off + hl, plen)
            .await
            .map_err(|e| format!("read error: {e}"))?
    } else {
        AlignedBuf::zeroed(0)
    };
    if format::payload_crc(&payload) != h.payload_crc {
        return Err("torn or damaged record (payload checksum)".into());
    }
    Ok(Record { header: h, payload })
}

/// The records replayed, in sequence order, and where they were read.
#[derive(Clone, Debug)]
pub struct Chain {
    /// The superblock that says where the session starts (its nonce and tail: of the
    /// records found, if the superblock found was older than them).
    pub sb: LogSuper,
    /// (ring offset, sequence) of each valid record of the session from the tail on, in
    /// sequence order (with gaps where a record is damaged on every device).
    pub records: Vec<(u64, u64)>,
    /// What the scan found beyond the valid records, in words.
    pub end: String,
}

/// A record of the session, from the tail up to the newest found, that no device holds
/// whole.
#[derive(Clone, Debug)]
pub struct Damaged {
    pub seq: u64,
    /// Its header, where a device still has it intact (its payload is damaged or torn):
    /// the member ranges it wrote are known.
    pub header: Option<Header>,
    /// A later record says this one was durable on the log before it was written: it may
    /// have been acknowledged and applied to the pool. Without that, it may be an append
    /// the crash tore (never acknowledged, never applied).
    pub vouched: bool,
    /// Why each device's copy is not valid.
    pub why: String,
}

/// What replay finds on a log's devices.
pub struct Scan {
    /// The device holding the most valid records.
    pub best: usize,
    /// The valid records, in sequence order.
    pub chain: Chain,
    /// The device each record of `chain` is read from (a mirrored log's devices stand in
    /// for each other record by record).
    pub sources: Vec<usize>,
    /// The header of each record of `chain`.
    pub headers: Vec<Header>,
    /// Records of the session that no device holds whole, in sequence order.
    pub damaged: Vec<Damaged>,
    /// Each device's count of valid records, or why it could not be read.
    pub per_device: Vec<Result<usize, String>>,
    /// The highest generation and sequence seen (a new session continues after them).
    pub generation: u64,
    pub last_seq: u64,
}

/// The two superblock copies of a device: the newer valid one, and whether the other one
/// is valid too.
async fn read_super_copies(dev: &Arc<dyn BlockDev>) -> Result<(LogSuper, bool), String> {
    if dev.size() < RING_START + format::MIN_RING {
        return Err(format!("{} is too small to be a log device", dev.name()));
    }
    let area = read_exact(dev, 0, 2 * BLOCK)
        .await
        .map_err(|e| format!("reading {}: {e}", dev.name()))?;
    let both = LogSuper::decode(&area[..BLOCK]).is_ok() && LogSuper::decode(&area[BLOCK..]).is_ok();
    let sb = LogSuper::decode_area(&area).map_err(|e| format!("{}: {e}", dev.name()))?;
    Ok((sb, both))
}

/// Every record header in a device's ring that lies at the offset it names (of any
/// session, valid header checksum; payloads not read).
async fn ring_headers(dev: &Arc<dyn BlockDev>, ring_len: u64) -> Result<Vec<Header>, String> {
    const STEP: u64 = 1 << 20;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < ring_len {
        let n = STEP.min(ring_len - pos);
        let buf = read_exact(dev, RING_START + pos, n as usize)
            .await
            .map_err(|e| format!("reading the ring of {}: {e}", dev.name()))?;
        for b in (0..n as usize).step_by(BLOCK) {
            let at = pos + b as u64;
            let Some(hl) = format::header_len_of(&buf[b..b + BLOCK]) else {
                continue;
            };
            if at + hl as u64 > ring_len {
                continue;
            }
            let h = if b + hl <= n as usize {
                format::decode_header(&buf[b..b + hl])
            } else {
                match read_exact(dev, RING_START + at, hl).await {
                    Ok(hb) => format::decode_header(&hb),
                    Err(e) => return Err(format!("reading the ring of {}: {e}", dev.name())),
                }
            };
            if let Ok(h) = h {
                if h.off == at && at + h.total_len <= ring_len {
                    out.push(h);
                }
            }
        }
        pos += n;
    }
    Ok(out)
}

/// What one device holds of one record.
enum Copy {
    Valid(usize, Header),
    /// The header is intact, the payload is not.
    Damaged(Header, String),
}

/// Scan the given devices of one log (those the array trusts), checking that each
/// belongs to the array.
///
/// The whole ring of every device is read, not only the chain from the tail: a record
/// damaged in the middle must not hide the records after it. Those were acknowledged and
/// may already be in the pool, so replaying only the records before the damage would
/// write older bytes over newer ones (issue 25). The scan returns every valid record of
/// the session from the tail on, in sequence order (each from whichever device holds it
/// whole: a mirrored log's copies stand in for each other record by record), and every
/// record between them, or after them with an intact header, that no device holds whole
/// ([`Damaged`]). [`Scan::plan`] decides what to replay.
///
/// The session (nonce) and tail come from the newest superblock of any device. If every
/// device could read one copy only, the newer copy may be the damaged one: records of
/// another session with higher sequence numbers than any of the superblock's session
/// then show that the superblock found is older than the session that wrote them (a
/// session start's superblock lost), and that session is replayed from its oldest
/// record found that can still be live ([`live_from`]); records missing before it are
/// taken as reclaimed (a checkpoint's superblock lost).
pub async fn scan(devs: &[LogDevice], array_uuid: Uuid) -> Result<Scan, String> {
    let mut per_device: Vec<Result<usize, String>> = Vec::new();
    let mut sbs: Vec<Option<(LogSuper, bool)>> = Vec::new();
    for d in devs {
        match read_super_copies(&d.dev).await {
            Ok((sb, _)) if sb.array_uuid != array_uuid || sb.log_uuid != d.uuid => {
                per_device.push(Err(format!(
                    "{} is a log device of another array or another log",
                    d.path
                )));
                sbs.push(None);
            }
            Ok(x) => {
                per_device.push(Ok(0));
                sbs.push(Some(x));
            }
            Err(e) => {
                per_device.push(Err(e));
                sbs.push(None);
            }
        }
    }
    let Some(newest) = sbs
        .iter()
        .flatten()
        .max_by_key(|(sb, _)| sb.generation)
        .map(|(sb, _)| sb.clone())
    else {
        let why: Vec<String> = per_device
            .iter()
            .filter_map(|r| r.as_ref().err().cloned())
            .collect();
        return Err(format!("no log device could be read ({})", why.join("; ")));
    };
    let fallback = sbs.iter().flatten().all(|(_, both)| !both);
    let generation = newest.generation;
    // Every device's headers (the ring of the smallest device: every device of a log
    // has the same ring, a larger one only unused space past it).
    let ring_len = newest.ring_len;
    let mut headers: Vec<Vec<Header>> = Vec::new();
    for (i, d) in devs.iter().enumerate() {
        if sbs[i].is_none() {
            headers.push(Vec::new());
            continue;
        }
        match ring_headers(&d.dev, ring_len.min(ring_len_for(d.dev.size()))).await {
            Ok(h) => headers.push(h),
            Err(e) => {
                per_device[i] = Err(e);
                sbs[i] = None;
                headers.push(Vec::new());
            }
        }
    }
    let all = || headers.iter().flatten();
    let last_any = all().map(|h| h.seq).max().unwrap_or(0);
    let (mut nonce, mut tail) = (newest.nonce, newest.tail_seq);
    let mut adopted = false;
    if fallback {
        let own = all()
            .filter(|h| h.nonce == nonce && h.seq >= tail)
            .map(|h| h.seq)
            .max();
        if let Some(top) = all().filter(|h| h.seq >= tail).max_by_key(|h| h.seq) {
            if top.nonce != nonce && own.is_none_or(|o| top.seq > o) {
                nonce = top.nonce;
                tail = all()
                    .filter(|h| h.nonce == nonce)
                    .map(|h| h.seq)
                    .min()
                    .unwrap_or(top.seq);
                adopted = true;
            }
        }
    }
    // Each record of the session from the tail on: a valid copy if any device has one.
    let mut found: std::collections::BTreeMap<u64, Copy> = Default::default();
    for (i, d) in devs.iter().enumerate() {
        let mut valid = 0;
        for h in &headers[i] {
            if h.nonce != nonce || h.seq < tail {
                continue;
            }
            let seq = h.seq;
            if matches!(found.get(&seq), Some(Copy::Valid(..))) {
                valid += 1;
                continue;
            }
            match read_payload(&d.dev, ring_len, h.clone()).await {
                Ok(_) => {
                    valid += 1;
                    found.insert(seq, Copy::Valid(i, h.clone()));
                }
                Err(e) => {
                    let why = format!("{}: {e}", d.path);
                    match found.get_mut(&seq) {
                        Some(Copy::Damaged(_, w)) => *w = format!("{w}; {why}"),
                        _ => {
                            found.insert(seq, Copy::Damaged(h.clone(), why));
                        }
                    }
                }
            }
        }
        if let Ok(n) = &mut per_device[i] {
            *n = valid;
        }
    }
    // What the headers of the session say was durable.
    let durable_below = found
        .values()
        .filter_map(|c| match c {
            Copy::Valid(_, h) | Copy::Damaged(h, _) => h.durable_below,
        })
        .max()
        .unwrap_or(0);
    let top = found.keys().next_back().copied();
    // Behind a superblock that may be older than the newest checkpoint, the session's
    // records start at the oldest found that can still be live: missing records before
    // it were reclaimed, not damaged (a checkpoint's superblock lost).
    let first = if fallback {
        let at: Vec<(u64, u64, u64)> = found
            .iter()
            .map(|(&seq, c)| match c {
                Copy::Valid(_, h) | Copy::Damaged(h, _) => (seq, h.off, h.total_len),
            })
            .collect();
        live_from(&at, ring_len).unwrap_or(tail)
    } else {
        tail
    };
    if let Some(top) = top {
        if top.saturating_sub(first) > 2 * (ring_len / BLOCK as u64) {
            return Err(format!(
                "the log's records do not add up (sequence {first} to {top} in a ring of {} blocks)",
                ring_len / BLOCK as u64
            ));
        }
    }
    let mut records = Vec::new();
    let mut sources = Vec::new();
    let mut valid = Vec::new();
    let mut damaged = Vec::new();
    for seq in first..top.map_or(first, |t| t + 1) {
        match found.remove(&seq) {
            Some(Copy::Valid(i, h)) => {
                records.push((h.off, seq));
                sources.push(i);
                valid.push(h);
            }
            Some(Copy::Damaged(h, why)) => damaged.push(Damaged {
                seq,
                header: Some(h),
                vouched: seq < durable_below,
                why,
            }),
            None => damaged.push(Damaged {
                seq,
                header: None,
                vouched: seq < durable_below,
                why: "no intact header on any device".into(),
            }),
        }
    }
    // A record missing past the newest found is the end of the log, unless a header
    // vouches for it (that header would be the newest found).
    let best = (0..devs.len())
        .max_by_key(|&i| {
            (
                per_device[i].as_ref().ok().copied().unwrap_or(0),
                per_device[i].is_ok(),
                usize::MAX - i,
            )
        })
        .unwrap_or(0);
    let end = {
        let mut s = format!("{} valid record(s)", records.len());
        if !damaged.is_empty() {
            let seqs: Vec<String> = damaged.iter().map(|d| d.seq.to_string()).collect();
            s += &format!("; not whole on any device: {}", seqs.join(", "));
        }
        if adopted {
            s += "; the superblock found is older than the records (its newer copy is damaged)";
        }
        s
    };
    let mut sb = newest;
    sb.nonce = nonce;
    sb.tail_seq = tail;
    Ok(Scan {
        best,
        chain: Chain { sb, records, end },
        sources,
        headers: valid,
        damaged,
        per_device,
        generation,
        last_seq: last_any.max(tail.saturating_sub(1)),
    })
}

/// The oldest of the records found (`(seq, ring offset, length)`, in sequence order) from
/// which the records up to the newest can all be live at once.
///
/// Live records lie in the ring one after another in sequence order, within one turn
/// from the oldest (a record that does not fit before the ring's end starts at its
/// start), and every record missing between two found ones takes at least a block
/// between them. A record of the session that newer records have overrun cannot head
/// such a run, though its own bytes survive: one in the space a wrap skipped at the
/// ring's end, say, while the records after it, at the ring's start, were overwritten.
/// Replaying from it would take the overwritten records for damaged ones.
fn live_from(found: &[(u64, u64, u64)], ring_len: u64) -> Option<u64> {
    let fits = |run: &[(u64, u64, u64)]| {
        let base = run[0].1;
        let mut end = run[0].2;
        for w in run.windows(2) {
            let ((a, _, _), (b, off, len)) = (w[0], w[1]);
            let d = (off + ring_len - base) % ring_len;
            if d < end + (b - a - 1) * BLOCK as u64 || d + len > ring_len {
                return false;
            }
            end = d + len;
        }
        true
    };
    (0..found.len())
        .find(|&i| fits(&found[i..]))
        .map(|i| found[i].0)
}

/// A member range: `len` bytes at `offset` of slot `slot`'s data area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub slot: u32,
    pub offset: u64,
    pub len: u64,
}

/// What replay did about a record no device holds whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    pub seq: u64,
    /// The pool may hold bytes older than an acknowledged write of this record.
    pub lost: bool,
    /// What was found and done, in words.
    pub what: String,
    /// The member ranges the pool keeps as they are for it (stale if it was lost);
    /// `None`: not known (its header is damaged too).
    pub ranges: Option<Vec<Range>>,
}

/// What to replay: the valid records in sequence order, each member write of them
/// except the blocks a newer damaged record wrote (the pool keeps what it has there).
pub struct Plan {
    /// Indexes into the scan's chain, in order.
    pub steps: Vec<usize>,
    /// (slot, block) the pool keeps, with the sequence of the record that wrote it last:
    /// no older record is replayed over it.
    keep: std::collections::HashMap<(u32, u64), u64>,
    /// Every record no device holds whole, and what became of it.
    pub issues: Vec<Issue>,
}

impl Plan {
    /// Did the log lose an acknowledged write the pool may not hold?
    pub fn lost(&self) -> bool {
        self.issues.iter().any(|i| i.lost)
    }

    /// The member writes of the record with sequence `seq` to replay: (entry's slot,
    /// offset, bytes or `None` for zeros, length), with the blocks the pool keeps left
    /// out.
    pub fn writes<'a>(&self, seq: u64, rec: &'a Record) -> Vec<(u32, u64, Option<&'a [u8]>, u64)> {
        let mut out = Vec::new();
        for (e, data) in rec.writes() {
            let b = BLOCK as u64;
            let mut run: Option<(u64, u64)> = None; // (first byte, len) within the entry
            let push = |run: (u64, u64), out: &mut Vec<_>| {
                let (s, l) = run;
                out.push((
                    e.slot,
                    e.offset + s,
                    data.map(|d| &d[s as usize..(s + l) as usize]),
                    l,
                ));
            };
            for k in 0..(e.len as u64).div_ceil(b) {
                let kept = self
                    .keep
                    .get(&(e.slot, (e.offset + k * b) / b))
                    .is_some_and(|&by| by > seq);
                let len = b.min(e.len as u64 - k * b);
                match (&mut run, kept) {
                    (Some((_, l)), false) => *l += len,
                    (None, false) => run = Some((k * b, len)),
                    (Some(_), true) => push(run.take().unwrap(), &mut out),
                    (None, true) => {}
                }
            }
            if let Some(r) = run {
                push(r, &mut out);
            }
        }
        out
    }
}

/// The 4 KiB blocks (slot, block index) a record's entries write.
fn blocks_of(h: &Header) -> Vec<(u32, u64)> {
    let b = BLOCK as u64;
    h.entries
        .iter()
        .flat_map(|e| {
            let first = e.offset / b;
            let last = (e.offset + e.len as u64).div_ceil(b);
            (first..last).map(move |k| (e.slot, k))
        })
        .collect()
}

/// Runs of adjacent blocks, as member ranges.
fn ranges_of(mut blocks: Vec<(u32, u64)>) -> Vec<Range> {
    blocks.sort_unstable();
    blocks.dedup();
    let b = BLOCK as u64;
    let mut out: Vec<Range> = Vec::new();
    for (slot, k) in blocks {
        match out.last_mut() {
            Some(r) if r.slot == slot && r.offset + r.len == k * b => r.len += b,
            _ => out.push(Range {
                slot,
                offset: k * b,
                len: b,
            }),
        }
    }
    out
}

/// Does the pool hold a record's writes? `pool` gives the bytes the pool has at each
/// entry's range (`None`: they cannot be read); the record's payload checksum decides.
/// Used to prove that a record whose payload the log lost was applied.
pub fn pool_holds(h: &Header, mut pool: impl FnMut(&Entry) -> Option<Vec<u8>>) -> bool {
    let mut payload = Vec::new();
    let mut prev: Option<Vec<u8>> = None;
    for e in &h.entries {
        let Some(got) = pool(e) else {
            return false;
        };
        if got.len() != e.len as usize {
            return false;
        }
        if e.flags & ZERO != 0 {
            if got.iter().any(|&x| x != 0) {
                return false;
            }
            prev = None;
        } else if e.flags & SAME_DATA != 0 {
            if prev.as_ref() != Some(&got) {
                return false;
            }
        } else {
            payload.extend_from_slice(&got);
            prev = Some(got);
        }
    }
    format::payload_crc(&payload) == h.payload_crc
}

impl Scan {
    /// Read the `i`-th record of the chain from the device that holds it whole.
    pub async fn read(&self, devs: &[LogDevice], i: usize) -> Result<Record, String> {
        let (off, seq) = self.chain.records[i];
        let sb = &self.chain.sb;
        read_record(&devs[self.sources[i]].dev, sb.ring_len, sb.nonce, off, seq).await
    }

    /// Decide what to replay. `in_pool`: the damaged records (by sequence) whose writes
    /// the pool was found to hold ([`pool_holds`]).
    ///
    /// The rule: replay never writes a record's bytes over a block that a newer record
    /// wrote. Every valid record is replayed in sequence order, so a newer valid record
    /// always lands after an older one. For each record no device holds whole:
    /// - every block it wrote is written again by a newer valid record: superseded,
    ///   nothing lost;
    /// - the pool holds its writes (proven by its payload checksum): the blocks no newer
    ///   valid record writes are kept as the pool has them (no older record is replayed
    ///   over them), nothing lost;
    /// - a later record vouches that it was durable (so it may have been acknowledged and
    ///   applied), and neither of the above: LOST. Its blocks are kept as the pool has
    ///   them (its bytes, or older ones: the pool cannot say which); if its header is
    ///   damaged too, its blocks are unknown, and no record older than it is replayed
    ///   (any of them could revert it);
    /// - nothing vouches for it: an append the crash tore, never acknowledged (an
    ///   acknowledged record is durable, and the records appended after it say so); it
    ///   is left out.
    ///
    /// The caller refuses to start on a plan that [`Plan::lost`] something, unless told
    /// to go on.
    pub fn plan(&self, in_pool: &std::collections::HashSet<u64>) -> Plan {
        // The newest valid record that writes each block.
        let mut newest: std::collections::HashMap<(u32, u64), u64> = Default::default();
        for h in &self.headers {
            for b in blocks_of(h) {
                let e = newest.entry(b).or_insert(0);
                *e = (*e).max(h.seq);
            }
        }
        let mut keep: std::collections::HashMap<(u32, u64), u64> = Default::default();
        let mut issues = Vec::new();
        let mut cutoff = 0;
        for d in &self.damaged {
            let Some(h) = &d.header else {
                if d.vouched {
                    cutoff = cutoff.max(d.seq);
                    issues.push(Issue {
                        seq: d.seq,
                        lost: true,
                        what: format!(
                            "record {} was durable (a later record says so) and is damaged on every device, its header too: the member ranges it wrote are unknown, and no older record is replayed ({})",
                            d.seq, d.why
                        ),
                        ranges: None,
                    });
                } else {
                    issues.push(Issue {
                        seq: d.seq,
                        lost: false,
                        what: format!(
                            "record {} is missing and nothing says it was ever durable: an append the crash tore, left out ({})",
                            d.seq, d.why
                        ),
                        ranges: Some(Vec::new()),
                    });
                }
                continue;
            };
            let open: Vec<(u32, u64)> = blocks_of(h)
                .into_iter()
                .filter(|b| newest.get(b).is_none_or(|&n| n < d.seq))
                .collect();
            let (lost, what, kept) = if open.is_empty() {
                (
                    false,
                    format!(
                        "record {} is damaged ({}); newer records rewrite every block it wrote",
                        d.seq, d.why
                    ),
                    false,
                )
            } else if in_pool.contains(&d.seq) {
                (
                    false,
                    format!(
                        "record {} is damaged ({}); the pool holds its writes, kept as they are",
                        d.seq, d.why
                    ),
                    true,
                )
            } else if d.vouched {
                (
                    true,
                    format!(
                        "record {} was durable (a later record says so) and is damaged on every device ({}); the pool does not hold its writes: its member ranges may be stale, and are kept as the pool has them",
                        d.seq, d.why
                    ),
                    true,
                )
            } else {
                (
                    false,
                    format!(
                        "record {} is damaged ({}) and nothing says it was ever durable: an append the crash tore, left out",
                        d.seq, d.why
                    ),
                    false,
                )
            };
            if kept {
                for b in &open {
                    let e = keep.entry(*b).or_insert(0);
                    *e = (*e).max(d.seq);
                }
            }
            issues.push(Issue {
                seq: d.seq,
                lost,
                what,
                ranges: Some(if kept { ranges_of(open) } else { Vec::new() }),
            });
        }
        let steps: Vec<usize> = (0..self.chain.records.len())
            .filter(|&i| self.chain.records[i].1 > cutoff)
            .collect();
        if cutoff > 0 {
            let skipped = self.chain.records.len() - steps.len();
            if skipped > 0 {
                issues.push(Issue {
                    seq: cutoff,
                    lost: true,
                    what: format!(
                        "{skipped} valid record(s) older than record {cutoff} not replayed (the pool keeps what it holds)"
                    ),
                    ranges: None,
                });
            }
        }
        Plan {
            steps,
            keep,
            issues,
        }
    }
}

impl Log {
    /// Start a new session on `devs` (formatted, or replayed and with the pool flushed
    /// since): every device gets a superblock with a new nonce, so that no record from
    /// before is ever replayed again. Devices whose write fails are returned as failed
    /// (with the error) and left out; if none is left, an error.
    pub async fn start(
        devs: Vec<LogDevice>,
        array_uuid: Uuid,
        after: Option<&Scan>,
        host: Arc<dyn LogHost>,
    ) -> Result<(Arc<Log>, Vec<(LogDevice, String)>), LogError> {
        let ring_len = devs
            .iter()
            .map(|d| ring_len_for(d.dev.size()))
            .min()
            .ok_or(LogError::Failed("no log device".into()))?;
        if ring_len < format::MIN_RING {
            return Err(LogError::Io("a log device is too small".into()));
        }
        let generation = after.map(|s| s.generation).unwrap_or(2) + 1;
        let next_seq = after.map(|s| s.last_seq).unwrap_or(1) + 1;
        let nonce = Uuid::new_v4().as_u64_pair().0;
        let mut ok = Vec::new();
        let mut failed = Vec::new();
        for d in devs {
            let sb = LogSuper {
                array_uuid,
                log_uuid: d.uuid,
                generation,
                nonce,
                tail_seq: next_seq,
                tail_off: 0,
                ring_len,
            };
            match write_super(&d.dev, &sb).await {
                Ok(()) => ok.push(d),
                Err(e) => failed.push((d, e.to_string())),
            }
        }
        if ok.is_empty() {
            let why: Vec<String> = failed
                .iter()
                .map(|(d, e)| format!("{}: {e}", d.path))
                .collect();
            return Err(LogError::Failed(why.join("; ")));
        }
        let log = Arc::new_cyclic(|me| Log {
            me: me.clone(),
            array_uuid,
            ring_len,
            devs: RwLock::new(ok.into_iter().map(DevRt::new).collect()),
            ring: Mutex::new(Ring {
                nonce,
                generation,
                next_seq,
                head: 0,
                live: VecDeque::new(),
                durable_upto: next_seq,
                vouched_upto: next_seq,
                failed: None,
                paused: false,
                closed: false,
            }),
            changed: tokio::sync::Notify::new(),
            ckpt: tokio::sync::Mutex::new(()),
            ckpt_running: AtomicBool::new(false),
            host,
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
        });
        Ok((log, failed))
    }

    pub fn ring_len(&self) -> u64 {
        self.ring_len
    }

    /// The largest record accepted (a quarter of the ring: there is always room for the
    /// records in flight while older ones are reclaimed).
    pub fn max_record(&self) -> u64 {
        self.ring_len / 4
    }

    /// Bytes a record of these writes takes in the ring.
    pub fn record_len(writes: &[Write]) -> u64 {
        format::record_len(&Self::entries(writes))
    }

    fn entries(writes: &[Write]) -> Vec<Entry> {
        let mut out: Vec<Entry> = Vec::with_capacity(writes.len());
        for (i, w) in writes.iter().enumerate() {
            let (flags, len) = match &w.data {
                Data::Zero(n) => (ZERO, *n),
                Data::Bytes(b) => {
                    let same = i > 0
                        && matches!(&writes[i - 1].data, Data::Bytes(p)
                            if p.as_ptr() == b.as_ptr() && p.len() == b.len());
                    (if same { SAME_DATA } else { 0 }, b.len() as u32)
                }
            };
            out.push(Entry {
                slot: w.slot,
                flags,
                offset: w.offset,
                len,
            });
        }
        out
    }

    /// Append a record and wait until it, and every record before it, is durable.
    pub async fn append(self: &Arc<Self>, writes: &[Write]) -> Result<Ticket, LogError> {
        let entries = Self::entries(writes);
        format::check_entries(&entries).map_err(LogError::Io)?;
        let len = format::record_len(&entries);
        if len > self.max_record() {
            return Err(LogError::TooBig(len));
        }
        // The record in one buffer: header, then the payload.
        let hl = format::header_len(entries.len());
        let mut buf = AlignedBuf::zeroed(len as usize);
        let mut pos = hl;
        for (w, e) in writes.iter().zip(&entries) {
            match &w.data {
                Data::Bytes(b) if e.payload() > 0 => {
                    // SAFETY: the engine does not change a write's buffer while it is
                    // logged.
                    buf[pos..pos + b.len()].copy_from_slice(unsafe { b.as_slice() });
                    pos += b.len();
                }
                _ => {}
            }
        }
        let pcrc = format::payload_crc(&buf[hl..]);
        let (seq, off) = loop {
            let notified = self.changed.notified();
            {
                let mut r = self.ring.lock();
                if let Some(e) = &r.failed {
                    return Err(LogError::Failed(e.clone()));
                }
                if r.closed {
                    return Err(LogError::Closed);
                }
                if !r.paused {
                    if let Some(off) = r.place(len, self.ring_len) {
                        let seq = r.next_seq;
                        r.next_seq += 1;
                        r.head = off + len;
                        r.live.push_back(Live {
                            seq,
                            off,
                            len,
                            state: St::Writing,
                        });
                        break (seq, off);
                    }
                }
            }
            // No room: reclaim what is applied (or wait for it to be).
            self.kick_checkpoint();
            notified.await;
        };
        // The header says which records before it are durable: replay tells by it a
        // record damaged after it was durable from an append a crash tore (`scan`).
        let (nonce, durable) = {
            let mut r = self.ring.lock();
            let d = r.durable_upto;
            r.vouched_upto = r.vouched_upto.max(d);
            (r.nonce, d)
        };
        format::encode_header(&mut buf[..hl], nonce, seq, off, &entries, pcrc, durable);
        let buf = buf.into_shared();
        let ok = self.write_all_devs(RING_START + off, buf).await;
        {
            let mut r = self.ring.lock();
            if !ok {
                r.failed
                    .get_or_insert_with(|| "every log device failed".to_string());
                // Never acknowledged: nothing of it is owed to the pool (`drain`).
                r.set(seq, St::Applied);
            } else {
                r.set(seq, St::Durable);
            }
            r.advance();
        }
        self.changed.notify_waiters();
        if !ok {
            return Err(LogError::Failed(
                self.ring.lock().failed.clone().unwrap_or_default(),
            ));
        }
        self.records.fetch_add(1, Relaxed);
        self.bytes.fetch_add(len, Relaxed);
        // In sequence order: every record before this one is durable too.
        loop {
            let notified = self.changed.notified();
            {
                let mut r = self.ring.lock();
                if let Some(e) = &r.failed {
                    let e = e.clone();
                    r.set(seq, St::Applied);
                    drop(r);
                    self.changed.notify_waiters();
                    return Err(LogError::Failed(e));
                }
                if r.durable_upto > seq {
                    break;
                }
            }
            notified.await;
        }
        Ok(Ticket {
            log: self.clone(),
            seq,
            done: false,
        })
    }

    /// Make the log say that every record acknowledged so far was durable: if a record was
    /// appended since the last one that says so, append an empty record (one 4 KiB log
    /// write), whose header vouches for all before it. Called for a client's FLUSH: replay
    /// then knows each of those records was acknowledged, so a damaged one is never
    /// mistaken for an append the crash tore (see [`scan`]).
    pub async fn seal(self: &Arc<Self>) -> Result<(), LogError> {
        let need = {
            let r = self.ring.lock();
            r.next_seq > r.vouched_upto
        };
        if need {
            self.append(&[]).await?.applied();
        }
        Ok(())
    }

    /// Write `buf` at `off` of every device in service, with FUA. A device that fails is
    /// recorded as failed before this returns. True if at least one device has it.
    async fn write_all_devs(&self, off: u64, buf: SharedBuf) -> bool {
        let devs = self.active_devs();
        let futs = devs.iter().map(|d| {
            let buf = buf.clone();
            async move {
                let r = dev::write_at(&d.d.dev, off, buf, true, IoClass::Foreground).await;
                (d.clone(), r)
            }
        });
        let mut ok = 0;
        for (d, r) in futures::future::join_all(futs).await {
            match r {
                Ok(()) if d.state.load(Relaxed) == ACTIVE => ok += 1,
                Ok(()) => {}
                Err(e) => self.device_error(&d, e.to_string()).await,
            }
        }
        // A device that failed meanwhile (another record's write) is recorded before its
        // failure is relied on: wait for anyone recording it.
        for d in &devs {
            if d.state.load(Relaxed) != ACTIVE {
                let _g = d.failing.lock().await;
            }
        }
        ok > 0
    }

    fn active_devs(&self) -> Vec<Arc<DevRt>> {
        self.devs
            .read()
            .iter()
            .filter(|d| d.state.load(Relaxed) == ACTIVE)
            .cloned()
            .collect()
    }

    async fn device_error(&self, d: &Arc<DevRt>, e: String) {
        d.write_errors.fetch_add(1, Relaxed);
        let _g = d.failing.lock().await;
        if d.state.load(Relaxed) == FAILED {
            return;
        }
        d.state.store(FAILING, Relaxed);
        tracing::error!(device = %d.d.path, error = %e, "log device failed");
        *d.reason.lock() = Some(e.clone());
        let others = self
            .devs
            .read()
            .iter()
            .any(|x| !Arc::ptr_eq(x, d) && x.state.load(Relaxed) == ACTIVE);
        if others {
            self.host.device_failed(d.d.uuid, e).await;
        }
        // The last device: the log fails as a whole (the engine records that, once what
        // the log acknowledged is durable in the pool).
        d.state.store(FAILED, Relaxed);
    }

    fn applied(&self, seq: u64) {
        let over = {
            let mut r = self.ring.lock();
            r.set(seq, St::Applied);
            r.used() > self.ring_len / 2
        };
        self.changed.notify_waiters();
        if over {
            self.kick_checkpoint();
        }
    }

    /// Start a checkpoint in the background unless one runs.
    fn kick_checkpoint(&self) {
        if self.ckpt_running.swap(true, Relaxed) {
            return;
        }
        match self.me.upgrade() {
            Some(me) if tokio::runtime::Handle::try_current().is_ok() => {
                tokio::spawn(async move {
                    let _ = me.checkpoint().await;
                    me.ckpt_running.store(false, Relaxed);
                    me.changed.notify_waiters();
                });
            }
            _ => self.ckpt_running.store(false, Relaxed),
        }
    }

    /// Reclaim every record applied so far: flush the pool, then advance the tail on
    /// every device. Returns how many records were reclaimed.
    pub async fn checkpoint(&self) -> Result<u64, LogError> {
        let _g = self.ckpt.lock().await;
        let (n, tail_seq, tail_off, generation) = {
            let mut r = self.ring.lock();
            if let Some(e) = &r.failed {
                return Err(LogError::Failed(e.clone()));
            }
            let n = r.live.iter().take_while(|l| l.state == St::Applied).count();
            if n == 0 {
                return Ok(0);
            }
            let (seq, off) = match r.live.get(n) {
                Some(l) => (l.seq, l.off),
                None => (r.next_seq, r.next_off(self.ring_len)),
            };
            r.generation += 1;
            (n, seq, off, r.generation)
        };
        self.host
            .flush_pool()
            .await
            .map_err(io_err("flushing the pool for a log checkpoint".into()))?;
        let nonce = self.ring.lock().nonce;
        let devs = self.active_devs();
        let mut ok = 0;
        for d in &devs {
            let sb = LogSuper {
                array_uuid: self.array_uuid,
                log_uuid: d.d.uuid,
                generation,
                nonce,
                tail_seq,
                tail_off,
                ring_len: self.ring_len,
            };
            match write_super(&d.d.dev, &sb).await {
                Ok(()) => ok += 1,
                Err(e) => self.device_error(d, e.to_string()).await,
            }
        }
        if ok == 0 {
            let mut r = self.ring.lock();
            r.failed
                .get_or_insert_with(|| "every log device failed".to_string());
            drop(r);
            self.changed.notify_waiters();
            return Err(LogError::Failed("every log device failed".into()));
        }
        {
            let mut r = self.ring.lock();
            for _ in 0..n {
                r.live.pop_front();
            }
        }
        self.checkpoints.fetch_add(1, Relaxed);
        self.changed.notify_waiters();
        Ok(n as u64)
    }

    /// Wait until every record appended so far is applied. After a failure too: the
    /// records it acknowledged are owed to the pool until their member writes completed
    /// (those it did not acknowledge are marked applied as their appends fail).
    pub async fn drain(&self) {
        loop {
            let notified = self.changed.notified();
            {
                let r = self.ring.lock();
                if r.live.iter().all(|l| l.state == St::Applied) {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Stop taking records, as if every device had failed (the engine met a record it
    /// cannot log: writing around the log would let an older record's replay overwrite
    /// the write).
    pub fn fail(&self, why: String) {
        self.ring.lock().failed.get_or_insert(why);
        self.changed.notify_waiters();
    }

    /// Stop taking records: wait for those in flight, reclaim everything (the pool is
    /// flushed), and refuse appends from then on.
    pub async fn close(&self) -> Result<(), LogError> {
        self.ring.lock().closed = true;
        self.changed.notify_waiters();
        self.drain().await;
        self.checkpoint().await.map(|_| ())
    }

    /// Mirror the log onto `dev` (formatted for this array): appends pause, everything in
    /// flight is applied and reclaimed, and the new device gets the current tail.
    pub async fn add_device(&self, d: LogDevice) -> Result<(), LogError> {
        if ring_len_for(d.dev.size()) < self.ring_len {
            return Err(LogError::Io(format!(
                "{} is smaller than the log it would mirror ({} bytes of ring)",
                d.path, self.ring_len
            )));
        }
        self.ring.lock().paused = true;
        let r = async {
            self.drain().await;
            self.checkpoint().await?;
            let _g = self.ckpt.lock().await;
            let (sb, n) = {
                let mut r = self.ring.lock();
                if let Some(e) = &r.failed {
                    return Err(LogError::Failed(e.clone()));
                }
                r.generation += 1;
                let (seq, off) = match r.live.front() {
                    Some(l) => (l.seq, l.off),
                    None => (r.next_seq, r.next_off(self.ring_len)),
                };
                (
                    LogSuper {
                        array_uuid: self.array_uuid,
                        log_uuid: d.uuid,
                        generation: r.generation,
                        nonce: r.nonce,
                        tail_seq: seq,
                        tail_off: off,
                        ring_len: self.ring_len,
                    },
                    r.live.len(),
                )
            };
            if n > 0 {
                return Err(LogError::Io("records still in flight".into()));
            }
            write_super(&d.dev, &sb)
                .await
                .map_err(io_err(format!("writing the log superblock of {}", d.path)))?;
            self.devs.write().push(DevRt::new(d));
            Ok(())
        }
        .await;
        self.ring.lock().paused = false;
        self.changed.notify_waiters();
        r
    }

    /// Stop writing a device (removed by the administrator). Refused for the last one.
    pub fn remove_device(&self, uuid: Uuid) -> Result<(), LogError> {
        let mut devs = self.devs.write();
        let active = devs
            .iter()
            .filter(|d| d.state.load(Relaxed) == ACTIVE)
            .count();
        let i = devs
            .iter()
            .position(|d| d.d.uuid == uuid)
            .ok_or_else(|| LogError::Io(format!("{uuid} is not a device of this log")))?;
        if devs[i].state.load(Relaxed) == ACTIVE && active == 1 {
            return Err(LogError::Io(
                "the last device of a log is not removed this way".into(),
            ));
        }
        devs.remove(i);
        Ok(())
    }

    /// Has every device failed?
    pub fn failed(&self) -> Option<String> {
        self.ring.lock().failed.clone()
    }

    pub fn info(&self) -> LogInfo {
        let r = self.ring.lock();
        LogInfo {
            capacity: self.ring_len,
            used: r.used(),
            live_records: r.live.len() as u64,
            records: self.records.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            checkpoints: self.checkpoints.load(Relaxed),
            abandoned: self.abandoned.load(Relaxed),
            failed: r.failed.clone(),
            devices: self
                .devs
                .read()
                .iter()
                .map(|d| DevInfo {
                    uuid: d.d.uuid,
                    path: d.d.path.clone(),
                    active: d.state.load(Relaxed) == ACTIVE,
                    reason: d.reason.lock().clone(),
                    write_errors: d.write_errors.load(Relaxed),
                })
                .collect(),
        }
    }
}

impl DevRt {
    fn new(d: LogDevice) -> Arc<DevRt> {
        Arc::new(DevRt {
            d,
            state: AtomicU8::new(ACTIVE),
            write_errors: AtomicU64::new(0),
            reason: Mutex::new(None),
            failing: tokio::sync::Mutex::new(()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::live_from;

    const B: u64 = super::BLOCK as u64;

    #[test]
    fn a_record_newer_ones_overran_does_not_head_the_live_run() {
        let ring = 100 * B;
        // Record 10 in the space a wrap skipped at the ring's end; 11 to 14 were at the
        // ring's start and newer records (20, 21) overwrote them; 15 to 19 follow.
        let found = [
            (10, 95 * B, 3 * B),
            (15, 20 * B, 10 * B),
            (16, 30 * B, 10 * B),
            (17, 40 * B, 10 * B),
            (18, 50 * B, 10 * B),
            (19, 60 * B, 30 * B),
            (20, 0, 10 * B),
            (21, 10 * B, 5 * B),
        ];
        assert_eq!(live_from(&found, ring), Some(15));
        // Without the newer records at the start, 10 can head the run: 11 to 14 lie in
        // its first 20 blocks, missing (damaged), not reclaimed.
        assert_eq!(live_from(&found[..6], ring), Some(10));
    }

    #[test]
    fn missing_records_need_a_block_each() {
        let ring = 100 * B;
        // Four records missing between 1 and 6 need four blocks; three are free.
        let found = [(1, 0, B), (6, 4 * B, B), (7, 5 * B, B)];
        assert_eq!(live_from(&found, ring), Some(6));
        let found = [(1, 0, B), (6, 5 * B, B), (7, 6 * B, B)];
        assert_eq!(live_from(&found, ring), Some(1));
        // A run may fill the ring, never lap it.
        let found = [(1, 50 * B, 50 * B), (2, 0, 50 * B)];
        assert_eq!(live_from(&found, ring), Some(1));
        let found = [(1, 50 * B, 50 * B), (2, 0, 51 * B)];
        assert_eq!(live_from(&found, ring), Some(2));
        assert_eq!(live_from(&[], ring), None);
    }
}
