//! Who may write the members: one head (host) at a time, as ZFS's multihost protection
//! (MMP) keeps one host writing a pool. Ideas from OpenZFS `mmp.c`, none of its code.
//!
//! Every member carries an owner block: the array, the owning host (an id and a name),
//! the owner's session (a nonce made at each start), a heartbeat (a counter and a wall
//! clock timestamp, rewritten every `interval`), the owner's interval and lease, and
//! whether the owner holds or has released the members. It lives in the last 4 KiB of the
//! first superblock copy's 32 KiB, which superblock writes never reach (a superblock is
//! written in whole 4 KiB blocks from the copy's start and is refused past
//! `superblock::OWNER_OFFSET`), so a heartbeat never rewrites a superblock.
//!
//! - Taking the members ([`acquire`]): an owner block naming another host that holds the
//!   members is watched for longer than its lease; a heartbeat that advances refuses the
//!   start, naming the host and when it was last seen. A stale one (or `force`) is taken
//!   over: our block is written, then kept (heartbeat by heartbeat) for longer than the
//!   old owner's lease before anything else is written, so the old owner's lease has
//!   lapsed (see below) before our first write.
//! - Fencing: each heartbeat reads the owner block back before writing it. Another owner
//!   there means the members were taken over: the array stops writing for good
//!   ("fenced: members taken over by HOST").
//! - The lease: member writes are refused (no member failed, the client gets EIO) while
//!   the last successful heartbeat is older than the lease (`interval * lease_multiple`);
//!   a client write first re-checks ownership by a heartbeat, as MMP suspends a pool. A
//!   head that was paused or cut off past its lease therefore writes nothing until it has
//!   read its owner blocks again. The check is one atomic load and a clock read.
//! - A clean stop marks the blocks released: another host starts at once.
//!
//! The same host id in the block with another session is this host's earlier start: the
//! host's own lock (the state directory) makes it gone, and it is taken over without a
//! wait (MMP skips its activity check for its own hostid likewise).
//!
//! Identity: the owner block also carries a nonce per member, so that one member reached
//! under two names (a file and a loop device over it, two NBD URIs of one export) shows
//! the same block under both ([`probe_identity`]).

use crate::buf::AlignedBuf;
use crate::dev::{self, BlockDev, IoClass};
use crate::error::{Error, Msg, Result, Step};
use crate::superblock::OWNER_OFFSET;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The owner block's size: from `superblock::OWNER_OFFSET` to the end of the first copy.
pub const BLOCK: usize = 4096;
const _: () = assert!(OWNER_OFFSET as usize + BLOCK == crate::superblock::COPY_SIZE);
const MAGIC: [u8; 8] = *b"SBODown\x01";
/// Default heartbeat interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Default lease, in intervals: a head writes nothing once its last heartbeat is older.
pub const DEFAULT_LEASE_MULTIPLE: u32 = 5;

/// This head's identity and heartbeat settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The host: one id per host (sbod keeps it in its state directory).
    pub host: Uuid,
    /// Its name, for messages.
    pub host_name: String,
    pub interval: Duration,
    pub lease_multiple: u32,
}

impl Config {
    /// How long a heartbeat keeps writes allowed.
    pub fn lease(&self) -> Duration {
        self.interval * self.lease_multiple.max(2)
    }
}

static DEFAULT: parking_lot::RwLock<Option<Config>> = parking_lot::RwLock::new(None);

/// Set the configuration arrays get when none is given (the CLI sets its host id from
/// its state directory).
pub fn set_default(c: Config) {
    *DEFAULT.write() = Some(c);
}

/// The configuration arrays get when none is given: the one set, else a host id made once
/// per process with this machine's host name and the default timings.
pub fn default_config() -> Config {
    if let Some(c) = DEFAULT.read().clone() {
        return c;
    }
    static PROCESS: OnceLock<Uuid> = OnceLock::new();
    Config {
        host: *PROCESS.get_or_init(Uuid::new_v4),
        host_name: host_name(),
        interval: DEFAULT_INTERVAL,
        lease_multiple: DEFAULT_LEASE_MULTIPLE,
    }
}

/// This machine's host name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown host".into())
}

/// What the owner block says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub array: Uuid,
    pub host: Uuid,
    pub host_name: String,
    pub session: Uuid,
    /// Made per member at each claim: two names showing the same nonce are one member.
    pub member_nonce: Uuid,
    /// Heartbeat counter.
    pub seq: u64,
    /// Unix milliseconds of the heartbeat (for messages: the lease is timed by the
    /// owner's own monotonic clock, never by comparing clocks of two hosts).
    pub stamp_ms: u64,
    pub interval_ms: u32,
    pub lease_multiple: u32,
    /// Released by a clean stop.
    pub released: bool,
}

impl Block {
    pub fn encode(&self) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(BLOCK);
        let mut w = Vec::with_capacity(256);
        w.extend_from_slice(&MAGIC);
        w.extend_from_slice(&[0; 4]); // crc, patched below
        w.extend_from_slice(self.array.as_bytes());
        w.extend_from_slice(self.host.as_bytes());
        w.extend_from_slice(self.session.as_bytes());
        w.extend_from_slice(self.member_nonce.as_bytes());
        w.extend_from_slice(&self.seq.to_le_bytes());
        w.extend_from_slice(&self.stamp_ms.to_le_bytes());
        w.extend_from_slice(&self.interval_ms.to_le_bytes());
        w.extend_from_slice(&self.lease_multiple.to_le_bytes());
        w.push(self.released as u8);
        w.extend_from_slice(&[0; 8]); // reserved
        let name = &self.host_name.as_bytes()[..self.host_name.len().min(200)];
        w.push(name.len() as u8);
        w.extend_from_slice(name);
        let crc = crc32c::crc32c(&w);
        w[8..12].copy_from_slice(&crc.to_le_bytes());
        b[..w.len()].copy_from_slice(&w);
        b
    }

    /// Decode; `None` for a block that holds none (zeros, an older sbod's array, damage:
    /// a torn block is treated as no owner, and the superblocks still say whose array
    /// it is).
    pub fn decode(b: &[u8]) -> Option<Block> {
        if b.len() < 110 || b[..8] != MAGIC {
            return None;
        }
        let n = b[109] as usize;
        let end = 110 + n;
        if end > b.len() {
            return None;
        }
        let mut c = b[..end].to_vec();
        let stored = u32::from_le_bytes(c[8..12].try_into().ok()?);
        c[8..12].fill(0);
        if crc32c::crc32c(&c) != stored {
            return None;
        }
        let uuid = |at: usize| Uuid::from_bytes(b[at..at + 16].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        Some(Block {
            array: uuid(12),
            host: uuid(28),
            session: uuid(44),
            member_nonce: uuid(60),
            seq: u64_at(76),
            stamp_ms: u64_at(84),
            interval_ms: u32_at(92),
            lease_multiple: u32_at(96),
            released: b[100] != 0,
            host_name: String::from_utf8_lossy(&b[110..end]).into_owned(),
        })
        .filter(|_| b[101..109].iter().all(|&x| x == 0))
    }

    /// The owner's lease as it recorded it.
    fn lease(&self) -> Duration {
        Duration::from_millis(self.interval_ms as u64) * self.lease_multiple.max(2)
    }

    /// When it was last seen, in words.
    pub fn last_seen(&self) -> String {
        let now = unix_ms();
        if self.stamp_ms == 0 {
            return "never".into();
        }
        if now >= self.stamp_ms {
            format!("{:.1} s ago", (now - self.stamp_ms) as f64 / 1000.0)
        } else {
            format!(
                "{:.1} s in the future of this host's clock",
                (self.stamp_ms - now) as f64 / 1000.0
            )
        }
    }
}

// The layout above, spelled once: magic 0..8, crc 8..12, array 12..28, host 28..44,
// session 44..60, member nonce 60..76, seq 76..84, stamp 84..92, interval 92..96,
// multiple 96..100, released 100, reserved 101..109 (zero), name length 109, name.

pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Read a member's owner block.
pub async fn read_block(dev: &Arc<dyn BlockDev>) -> std::io::Result<Option<Block>> {
    let buf = AlignedBuf::zeroed(BLOCK).into_shared();
    dev::read_at(dev, OWNER_OFFSET, buf.clone(), IoClass::Urgent).await?;
    let b = buf.try_unwrap().expect("sole owner");
    Ok(Block::decode(&b))
}

/// Write a member's owner block, durably.
pub async fn write_block(dev: &Arc<dyn BlockDev>, b: &Block) -> std::io::Result<()> {
    dev::write_at(
        dev,
        OWNER_OFFSET,
        b.encode().into_shared(),
        true,
        IoClass::Urgent,
    )
    .await
}

fn process_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// The lease the data path checks before member writes: one atomic deadline (process
/// milliseconds, `u64::MAX` while the array holds no lease to keep: looking, created
/// before ownership), and the fence.
pub struct Lease {
    until: AtomicU64,
    fenced: AtomicBool,
    by: parking_lot::Mutex<Option<String>>,
}

impl Default for Lease {
    fn default() -> Lease {
        Lease {
            until: AtomicU64::new(u64::MAX),
            fenced: AtomicBool::new(false),
            by: parking_lot::Mutex::new(None),
        }
    }
}

impl Lease {
    /// May member writes go ahead now? (The hot path: an atomic load and a clock read.)
    #[inline]
    pub fn ok(&self) -> bool {
        let until = self.until.load(Ordering::Acquire);
        until == u64::MAX || (process_ms() <= until && !self.fenced.load(Ordering::Acquire))
    }

    /// A heartbeat that began at `began` (process ms) found every member still ours. Only
    /// ever moves the deadline later: beats overlap (see `Array::hold`), and one that
    /// began earlier may end after a later one.
    pub(crate) fn renew(&self, began: u64, lease: Duration) {
        if self.fenced.load(Ordering::Acquire) {
            return;
        }
        let new = began + lease.as_millis() as u64;
        let _ = self
            .until
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur == u64::MAX || new > cur).then_some(new)
            });
    }

    pub(crate) fn now() -> u64 {
        process_ms()
    }

    /// Another head took the members: no write ever again in this session.
    pub(crate) fn fence(&self, by: String) -> bool {
        *self.by.lock() = Some(by);
        self.until.store(0, Ordering::Release);
        !self.fenced.swap(true, Ordering::AcqRel)
    }

    /// Taken over: by whom.
    pub fn fenced_by(&self) -> Option<String> {
        self.fenced
            .load(Ordering::Acquire)
            .then(|| self.by.lock().clone().unwrap_or_default())
    }

    /// The error a refused write gets (mapped to EIO).
    pub(crate) fn error(&self, array: &str) -> Error {
        match self.fenced_by() {
            Some(by) => Error::Failed(
                Msg::new(format!(
                    "'{array}' is fenced: {by}; this head writes nothing more"
                ))
                .or(Step::say(
                    "use the array where it was taken over, or stop it there and start it here again",
                )),
            ),
            None => Error::Failed(
                Msg::new(format!(
                    "'{array}': the ownership lease of its members lapsed (the last heartbeat could not be written or read back): writes are refused until it is renewed"
                ))
                .or(Step::say("check that the members are reachable")),
            ),
        }
    }
}

/// The io error a member write refused by the lease completes with (never fails the
/// member: see `DataPath::write_failed`).
#[derive(Debug)]
pub(crate) struct LeaseLapsed;

impl std::fmt::Display for LeaseLapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the members' ownership lease lapsed: write refused")
    }
}

impl std::error::Error for LeaseLapsed {}

pub(crate) fn lapsed() -> std::io::Error {
    std::io::Error::other(LeaseLapsed)
}

pub(crate) fn is_lapsed(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<LeaseLapsed>())
}

/// Who we are when taking members.
pub(crate) struct Me<'a> {
    pub array: Uuid,
    pub array_name: &'a str,
    pub cfg: &'a Config,
    pub session: Uuid,
}

impl Me<'_> {
    fn block(&self, nonce: Uuid, seq: u64) -> Block {
        Block {
            array: self.array,
            host: self.cfg.host,
            host_name: self.cfg.host_name.clone(),
            session: self.session,
            member_nonce: nonce,
            seq,
            stamp_ms: unix_ms(),
            interval_ms: self.cfg.interval.as_millis().min(u32::MAX as u128) as u32,
            lease_multiple: self.cfg.lease_multiple,
            released: false,
        }
    }

    /// Is this block another head that may still be writing?
    fn other_holder<'b>(&self, b: &'b Option<Block>) -> Option<&'b Block> {
        b.as_ref()
            .filter(|b| !b.released && b.session != self.session && b.host != self.cfg.host)
    }
}

fn io_err(path: &str, e: std::io::Error) -> Error {
    Error::io(format!("reading the owner block of {path}"), e)
}

/// Take the members for this head (see the module's text). `members` are (name, device).
/// Returns the per-member nonces written (index-aligned), for the identity check.
pub(crate) async fn acquire(
    members: &[(String, Arc<dyn BlockDev>)],
    me: &Me<'_>,
    force: bool,
) -> Result<Vec<Uuid>> {
    let read_all = || async {
        let futs = members.iter().map(|(_, d)| read_block(d));
        let r = futures::future::join_all(futs).await;
        r.into_iter()
            .zip(members)
            .map(|(r, (p, _))| r.map_err(|e| io_err(p, e)))
            .collect::<Result<Vec<_>>>()
    };
    let first = read_all().await?;
    let mut wait = Duration::ZERO;
    let holders: Vec<(usize, Block)> = first
        .iter()
        .enumerate()
        .filter_map(|(i, b)| me.other_holder(b).map(|b| (i, b.clone())))
        .collect();
    if !holders.is_empty() {
        let lease = holders
            .iter()
            .map(|(_, b)| b.lease())
            .max()
            .unwrap_or_default()
            .max(me.cfg.lease());
        wait = lease + 2 * me.cfg.interval;
        if !force {
            // Watch for longer than the holder's lease: a live holder beats meanwhile.
            let step = holders
                .iter()
                .map(|(_, b)| Duration::from_millis(b.interval_ms.max(1) as u64))
                .min()
                .unwrap_or(me.cfg.interval)
                .min(me.cfg.interval);
            let began = Instant::now();
            while began.elapsed() < wait {
                tokio::time::sleep(step).await;
                let now = read_all().await?;
                for (i, old) in &holders {
                    if let Some(b) = me.other_holder(&now[*i]) {
                        if b.seq != old.seq || b.session != old.session {
                            return Err(alive(me.array_name, &members[*i].0, b));
                        }
                    }
                }
            }
            let (i, b) = &holders[0];
            tracing::warn!(array = %me.array_name, member = %members[*i].0, owner = %b.host_name,
                last_seen = %b.last_seen(), "taking over members whose owner's heartbeat stopped");
        } else {
            let (i, b) = &holders[0];
            tracing::warn!(array = %me.array_name, member = %members[*i].0, owner = %b.host_name,
                last_seen = %b.last_seen(), "forced: taking the members over from their owner (it is fenced)");
        }
    }
    let nonces: Vec<Uuid> = members.iter().map(|_| Uuid::new_v4()).collect();
    // Our claim (beat `seq`) on every member at once.
    let write_claim = |seq: u64| {
        let nonces = &nonces;
        async move {
            let futs = members.iter().zip(nonces).map(|((_, d), n)| {
                let b = me.block(*n, seq);
                async move { write_block(d, &b).await }
            });
            for (r, (p, _)) in futures::future::join_all(futs)
                .await
                .into_iter()
                .zip(members)
            {
                r.map_err(|e| Error::io(format!("writing the owner block of {p}"), e))?;
            }
            Ok::<(), Error>(())
        }
    };
    // Claim, then keep the claim by heartbeats for `wait`: a head still beating (a race
    // with our claim) shows up as its block over ours. Forced, we claim again (its next
    // heartbeat then reads ours and it stops); otherwise someone else is alive: refuse.
    let mut tries = 0;
    'claim: loop {
        tries += 1;
        let mut seq = 0;
        write_claim(seq).await?;
        let began = Instant::now();
        loop {
            let now = read_all().await?;
            for (i, b) in now.iter().enumerate() {
                if b.as_ref().is_some_and(|b| b.session == me.session) {
                    continue;
                }
                match me.other_holder(b) {
                    Some(b) if !force || tries >= 5 => {
                        return Err(alive(me.array_name, &members[i].0, b))
                    }
                    Some(_) => continue 'claim,
                    // Zeroed or released under us, or rewritten by another start of this
                    // host: claim again, a few times.
                    None if tries >= 5 => {
                        return Err(Error::Refused(
                            Msg::new(format!(
                                "the owner block of {} keeps changing under this head: another sbod of this host is using the members. Nothing was written but the owner blocks",
                                members[i].0
                            ))
                            .or(Step::say("stop the other sbod first")),
                        ))
                    }
                    None => continue 'claim,
                }
            }
            if began.elapsed() >= wait {
                return Ok(nonces);
            }
            tokio::time::sleep(me.cfg.interval.min(wait)).await;
            seq += 1;
            write_claim(seq).await?;
        }
    }
}

fn alive(array: &str, path: &str, b: &Block) -> Error {
    Error::Refused(
        Msg::new(format!(
            "'{array}' is in use by host {} (host id {}): the heartbeat on {path} advanced, last seen {}; two hosts writing the same members destroy the array. Nothing was written",
            b.host_name,
            b.host,
            b.last_seen()
        ))
        .or(Step::say(format!(
            "stop the array on {} first (a clean stop releases its members)",
            b.host_name
        )))
        .or(Step::force(format!(
            "take the members over from {} (it is fenced: its next writes fail)",
            b.host_name
        ))),
    )
}

/// Tell members apart by what they are: local devices by device numbers (a block
/// device's `st_rdev`, a file's `st_dev`+`st_ino`; a loop device over a file is matched
/// by its backing file), then every candidate by a nonce written to its owner block and
/// read back from all (aliases show the last one written under either name): the only
/// way for remote members. The blocks' former contents are put back. Refuses "A and B are
/// the same member".
pub async fn probe_identity(members: &[(String, Arc<dyn BlockDev>)]) -> Result<()> {
    check_local(members.iter().map(|(p, _)| p.as_str()))?;
    if members.len() < 2 {
        return Ok(());
    }
    // Save, stamp each with its own nonce (in order), read all back.
    let mut saved = Vec::with_capacity(members.len());
    for (p, d) in members {
        let buf = AlignedBuf::zeroed(BLOCK).into_shared();
        dev::read_at(d, OWNER_OFFSET, buf.clone(), IoClass::Foreground)
            .await
            .map_err(|e| io_err(p, e))?;
        saved.push(buf);
    }
    let nonces: Vec<Uuid> = members.iter().map(|_| Uuid::new_v4()).collect();
    let mut result = Ok(());
    for (k, ((p, d), n)) in members.iter().zip(&nonces).enumerate() {
        let probe = Block {
            array: Uuid::nil(),
            host: Uuid::nil(),
            host_name: String::new(),
            session: Uuid::nil(),
            member_nonce: *n,
            seq: 0,
            stamp_ms: 0,
            interval_ms: 0,
            lease_multiple: 0,
            released: true,
        };
        if let Err(e) = write_block(d, &probe).await {
            result = Err(Error::io(format!("writing {p}"), e));
            // Put back what was written so far.
            for ((_, d), s) in members[..k].iter().zip(&saved) {
                let _ = dev::write_at(d, OWNER_OFFSET, s.clone(), true, IoClass::Foreground).await;
            }
            return result;
        }
    }
    'probe_end: for (i, (p, d)) in members.iter().enumerate() {
        match read_block(d).await {
            Ok(Some(b)) if b.member_nonce == nonces[i] => {}
            Ok(Some(b)) => {
                if let Some(j) = nonces.iter().position(|n| *n == b.member_nonce) {
                    let (a, z) = if j < i { (j, i) } else { (i, j) };
                    result = Err(same(&members[a].0, &members[z].0));
                    break 'probe_end;
                }
                result = Err(Error::Refused(
                    format!("{p} did not read back what was written to it (another writer?)")
                        .into(),
                ));
                break 'probe_end;
            }
            Ok(None) => {
                result = Err(Error::Refused(
                    format!("{p} did not read back what was written to it").into(),
                ));
                break 'probe_end;
            }
            Err(e) => {
                result = Err(io_err(p, e));
                break 'probe_end;
            }
        }
    }
    // Put every block back as it was (aliases: the last write wins, all held the same).
    for ((_, d), s) in members.iter().zip(&saved).rev() {
        let _ = dev::write_at(d, OWNER_OFFSET, s.clone(), true, IoClass::Foreground).await;
    }
    result
}

/// Refuse two local paths that are one device (by device numbers; writes nothing).
pub fn check_local<'a>(paths: impl Iterator<Item = &'a str>) -> Result<()> {
    let mut seen: Vec<((u64, u64), &str)> = Vec::new();
    for p in paths {
        if let Some(k) = local_identity(p) {
            if let Some((_, first)) = seen.iter().find(|(x, _)| *x == k) {
                return Err(same(first, p));
            }
            seen.push((k, p));
        }
    }
    Ok(())
}

pub(crate) fn same(a: &str, b: &str) -> Error {
    Error::Invalid(
        Msg::new(format!(
            "{a} and {b} are the same member (one device under two names)"
        ))
        .or(Step::say("give each member once")),
    )
}

/// (device, inode) of what a local path is: a block device by its `st_rdev`; a loop
/// device by its backing file (from sysfs); a file by `st_dev`+`st_ino`. `None` for
/// remote members (URIs) and paths that cannot be looked at.
pub fn local_identity(path: &str) -> Option<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if path.contains("://") {
        return None;
    }
    let md = std::fs::metadata(path).ok()?;
    if md.file_type().is_block_device() {
        let rdev = md.rdev();
        let (major, minor) = (libc::major(rdev), libc::minor(rdev));
        // A loop device is its backing file.
        let sys = format!("/sys/dev/block/{major}:{minor}/loop");
        if let Ok(back) = std::fs::read_to_string(format!("{sys}/backing_file")) {
            // At an offset into its file it is another region: the nonce tells.
            let offset = std::fs::read_to_string(format!("{sys}/offset")).unwrap_or_default();
            if offset.trim() != "0" {
                return None;
            }
            let back = back.trim();
            if let Ok(b) = std::fs::metadata(back) {
                if b.file_type().is_block_device() {
                    return Some((0, b.rdev()));
                }
                return Some((b.dev(), b.ino()));
            }
        }
        return Some((0, rdev));
    }
    Some((md.dev(), md.ino()))
}
