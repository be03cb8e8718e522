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
//! After a crash, [`scan`] finds the records from the tail on, in order, stopping at the
//! first that is torn, damaged, from an earlier pass over the ring or from an earlier
//! session; replaying them (writing each entry to its member) is idempotent, and makes
//! every stripe that was being written consistent again, whichever of its member writes
//! had landed: the write hole closes.
//!
//! Two devices make a mirrored log: every record goes to both, and is durable once both
//! have it. A device that fails is recorded as failed by the array ([`LogHost`]) before
//! any record is acknowledged on the other alone; if both fail, appends fail and the
//! engine takes the in-pool path.
//!
//! Ordering: records are acknowledged in sequence order (a record waits for every earlier
//! one to be durable), so the records a replay finds before the first invalid one include
//! every record ever acknowledged, and execution of a record's member writes starts only
//! once it is acknowledged.
//!
//! Hand-written: this is the product's core (its I/O path), with a format of its own.

pub mod attach;
pub mod format;

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

/// Read the record expected at ring offset `off` with sequence `seq`, or why there is none.
async fn read_record(
    dev: &Arc<dyn BlockDev>,
    sb: &LogSuper,
    off: u64,
    seq: u64,
) -> Result<Record, String> {
    if off + BLOCK as u64 > sb.ring_len {
        return Err("end of the ring".into());
    }
    let first = read_exact(dev, RING_START + off, BLOCK)
        .await
        .map_err(|e| format!("read error: {e}"))?;
    let hl = format::header_len_of(&first).ok_or("no record")?;
    if off + hl as u64 > sb.ring_len {
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
    if h.nonce != sb.nonce {
        return Err("a record of an earlier session".into());
    }
    if h.seq != seq || h.off != off {
        return Err(format!(
            "a record of an earlier pass (sequence {}, expected {seq})",
            h.seq
        ));
    }
    if off + h.total_len > sb.ring_len {
        return Err("record past the end of the ring".into());
    }
    let plen = (h.total_len - hl as u64) as usize;
    let payload = if plen > 0 {
        read_exact(dev, RING_START + off + hl as u64, plen)
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

/// Where each record of a device's chain lies.
#[derive(Clone, Debug)]
pub struct Chain {
    pub sb: LogSuper,
    /// (ring offset, sequence) of each valid record from the tail on.
    pub records: Vec<(u64, u64)>,
    /// Why the chain ends there.
    pub end: String,
}

/// Follow a device's records from its tail until the first that is not valid.
pub async fn chain(dev: &Arc<dyn BlockDev>, sb: &LogSuper) -> Chain {
    let (mut off, mut seq) = (sb.tail_off, sb.tail_seq);
    let mut records = Vec::new();
    let end = loop {
        let r = match read_record(dev, sb, off, seq).await {
            // A record that did not fit the end of the ring went to its start.
            Err(e) if off != 0 => read_record(dev, sb, 0, seq).await.map_err(|_| (off, e)),
            r => r.map_err(|e| (off, e)),
        };
        match r {
            Ok(rec) => {
                records.push((rec.header.off, seq));
                off = rec.header.off + rec.header.total_len;
                if off >= sb.ring_len {
                    off = 0;
                }
                seq += 1;
            }
            Err((at, e)) => break format!("at ring offset {at}: {e}"),
        }
    };
    Chain {
        sb: sb.clone(),
        records,
        end,
    }
}

/// What replay finds on a log's devices.
pub struct Scan {
    /// The device whose chain is replayed (the longest), and its chain.
    pub best: usize,
    pub chain: Chain,
    /// Each device's chain length, or why it could not be read.
    pub per_device: Vec<Result<usize, String>>,
    /// The highest generation and sequence seen (a new session continues after them).
    pub generation: u64,
    pub last_seq: u64,
}

/// Scan the given devices of one log (those the array trusts), checking that each
/// belongs to the array. The chains of a mirrored log's devices agree but for a record
/// torn on one: the longest is replayed.
pub async fn scan(devs: &[LogDevice], array_uuid: Uuid) -> Result<Scan, String> {
    let mut per_device = Vec::new();
    let mut best: Option<(usize, Chain)> = None;
    let mut generation = 0;
    let mut last_seq = 0;
    for (i, d) in devs.iter().enumerate() {
        let sb = match read_super(&d.dev).await {
            Ok(sb) => sb,
            Err(e) => {
                per_device.push(Err(e));
                continue;
            }
        };
        if sb.array_uuid != array_uuid || sb.log_uuid != d.uuid {
            per_device.push(Err(format!(
                "{} is a log device of another array or another log",
                d.path
            )));
            continue;
        }
        generation = generation.max(sb.generation);
        let c = chain(&d.dev, &sb).await;
        last_seq = last_seq.max(sb.tail_seq + c.records.len() as u64);
        per_device.push(Ok(c.records.len()));
        if best
            .as_ref()
            .is_none_or(|(_, b)| c.records.len() > b.records.len())
        {
            best = Some((i, c));
        }
    }
    let Some((best, chain)) = best else {
        let why: Vec<String> = per_device
            .iter()
            .filter_map(|r| r.as_ref().err().cloned())
            .collect();
        return Err(format!("no log device could be read ({})", why.join("; ")));
    };
    Ok(Scan {
        best,
        chain,
        per_device,
        generation,
        last_seq,
    })
}

impl Scan {
    /// Read the `i`-th record of the chain from the chosen device.
    pub async fn read(&self, devs: &[LogDevice], i: usize) -> Result<Record, String> {
        let (off, seq) = self.chain.records[i];
        read_record(&devs[self.best].dev, &self.chain.sb, off, seq).await
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
        let nonce = self.ring.lock().nonce;
        format::encode_header(&mut buf[..hl], nonce, seq, off, &entries, pcrc);
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
