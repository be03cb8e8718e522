//! Remote members: a block device on another host, exported over NBD (`sbod export`,
//! nbdkit, qemu-nbd), driven as one more [`BlockDev`].
//!
//! Each remote member has its own connections (several when the export allows multi-conn),
//! its own reader, writer and supervisor tasks and its own queue: nothing is shared between
//! members, so a slow or dead host only holds up the requests that touch it (the SBOD rule).
//! Its tasks run on the process's multi-threaded runtime when it is opened inside one (the
//! head's), where a request becomes a task without a hand-off to another thread: measured
//! 15-20% more 4K random reads through a head than a thread per member, which spent its
//! time switching (docs/PERFORMANCE.md); elsewhere, or with `SBOD_REMOTE_EXEC=thread`, on
//! a thread of its own.
//!
//! The link is watched, not trusted. A request without a reply for `io_timeout` (or an
//! idle probe that gets none) declares the connection dead; requests in flight are kept, with
//! their buffers, and sent again once a new connection is up (as qemu's NBD client does on
//! reconnect: NBD reads and writes are idempotent, and the engine never has two writes to
//! the same bytes in flight). Reconnection backs off from 100 ms to 2 s. A link that stays
//! down for `give_up` marks the member unreachable: every request then completes with
//! [`dev::unreachable`], which the engine takes as a dead disk. Reconnection goes on in the
//! background; when the host answers again [`BlockDev::link_up`] says so, and the head
//! re-adds the member. A server that breaks the protocol is not retried on the spot: the
//! member goes unreachable at once (its replies cannot be trusted), and is tried again only
//! after `give_up`.
//!
//! Semantics are those of direct I/O: no caching here; FUA and FLUSH go through to the
//! server (FUA is emulated with a FLUSH where the server lacks it).

use parking_lot::Mutex;
use sbod_core::buf::{AlignedBuf, SharedBuf};
use sbod_core::dev::{self, BlockDev, Done, IoKind, IoReq};
use sbod_nbd::{ClientBuf, ClientOptions, Command, Connection, Death, NbdUri, Outcome};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

pub use sbod_nbd::uri::is_uri;

/// How a remote member behaves. Environment variables set the defaults for a process
/// (see [`RemoteOptions::from_env`]).
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// Connections per member when the export allows multi-conn (else one).
    pub connections: usize,
    /// Connect and handshake within this time.
    pub connect_timeout: Duration,
    /// A request (or idle probe) with no reply for this long ends the connection.
    pub io_timeout: Duration,
    /// A link down this long makes the member unreachable (its requests fail).
    pub give_up: Duration,
    /// Refuse writes (examine, offline status).
    pub read_only: bool,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            connections: 4,
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(10),
            give_up: Duration::from_secs(20),
            read_only: false,
        }
    }
}

/// Parse "2s", "500ms", "1.5" (seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(v) = t.strip_suffix("ms") {
        (v, 0.001)
    } else if let Some(v) = t.strip_suffix('s') {
        (v, 1.0)
    } else if let Some(v) = t.strip_suffix('m') {
        (v, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (e.g. 500ms, 2s, 1m)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("'{s}': a duration must be positive"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

impl RemoteOptions {
    /// Defaults, overridden by `SBOD_REMOTE_CONNS`, `SBOD_REMOTE_CONNECT_TIMEOUT`,
    /// `SBOD_REMOTE_IO_TIMEOUT` and `SBOD_REMOTE_GIVE_UP` (durations like `2s`, `500ms`).
    pub fn from_env() -> io::Result<RemoteOptions> {
        let mut o = RemoteOptions::default();
        let bad =
            |k: &str, e: String| io::Error::new(io::ErrorKind::InvalidInput, format!("{k}: {e}"));
        if let Ok(v) = std::env::var("SBOD_REMOTE_CONNS") {
            o.connections = v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| bad("SBOD_REMOTE_CONNS", format!("'{v}' is not 1 to 64")))?;
        }
        for (k, slot) in [
            ("SBOD_REMOTE_CONNECT_TIMEOUT", &mut o.connect_timeout),
            ("SBOD_REMOTE_IO_TIMEOUT", &mut o.io_timeout),
            ("SBOD_REMOTE_GIVE_UP", &mut o.give_up),
        ] {
            if let Ok(v) = std::env::var(k) {
                *slot = parse_duration(&v).map_err(|e| bad(k, e))?;
            }
        }
        Ok(o)
    }
}

/// A view of an engine buffer as the client's buffer.
struct Buf(SharedBuf);

impl ClientBuf for Buf {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the engine hands this range to this one request until it completes
        // (SharedBuf's contract); nothing else writes it meanwhile.
        unsafe { self.0.as_slice() }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; a read's range is written only by this request.
        unsafe { self.0.as_mut_slice() }
    }
}

type Conns = Arc<Vec<Connection<Buf>>>;

/// The state of the link to the member's host.
#[derive(Clone)]
enum Link {
    Up { generation: u64, conns: Conns },
    Reconnecting { why: String },
    Down { why: String },
    Closed,
}

/// What the link looks like now, for status and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkState {
    Up,
    Reconnecting { why: String },
    Unreachable { why: String },
    Closed,
}

struct Inner {
    name: String,
    uri: NbdUri,
    opts: RemoteOptions,
    info: sbod_nbd::ExportInfo,
    link: watch::Sender<Link>,
    reconnects: AtomicU64,
    retried: AtomicU64,
    closed: AtomicBool,
    /// When the server last answered a request (ms since `epoch`): the link's health. A
    /// link that reconnects but never answers is as dead as one that never reconnects.
    last_answer: AtomicU64,
    epoch: Instant,
}

impl Inner {
    fn answered(&self) {
        self.last_answer
            .store(self.epoch.elapsed().as_millis() as u64, Relaxed);
    }

    fn silent_for(&self) -> Duration {
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_answer.load(Relaxed)))
    }
}

enum Msg {
    Io(IoReq, Completion),
    Close,
}

/// Completes its request exactly once: with the result, or "closed" if dropped unfinished.
struct Completion(Option<Done>);

impl Completion {
    fn finish(mut self, r: io::Result<()>) {
        if let Some(d) = self.0.take() {
            d(r);
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            d(Err(io::Error::other("member is closed")));
        }
    }
}

/// A member on another host.
pub struct RemoteDev {
    inner: Arc<Inner>,
    exec: Exec,
}

/// What runs a member's tasks.
enum Exec {
    /// Its own thread and runtime.
    Own {
        tx: mpsc::UnboundedSender<Msg>,
        thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    },
    /// The process's multi-threaded runtime (the head's): requests become tasks there
    /// directly, with no hand-off to another thread. The member still has its own
    /// connections, tasks and queue.
    Shared {
        handle: tokio::runtime::Handle,
        supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    },
}

/// `SBOD_REMOTE_EXEC`: `shared` (default: the caller's multi-threaded runtime, if any) or
/// `thread` (a thread per member).
fn shared_runtime() -> io::Result<Option<tokio::runtime::Handle>> {
    let want_shared = match std::env::var("SBOD_REMOTE_EXEC").as_deref() {
        Err(_) | Ok("") | Ok("shared") => true,
        Ok("thread") => false,
        Ok(v) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("SBOD_REMOTE_EXEC={v}: expected \"shared\" or \"thread\""),
            ))
        }
    };
    Ok(tokio::runtime::Handle::try_current().ok().filter(|h| {
        want_shared && h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
    }))
}

/// Connect and set up a member's state.
async fn start(name: String, uri: NbdUri, opts: RemoteOptions) -> io::Result<Arc<Inner>> {
    let conns = connect_all(&uri, &opts, None).await?;
    let info = conns[0].info().clone();
    let (link, _) = watch::channel(Link::Up {
        generation: 1,
        conns: Arc::new(conns),
    });
    Ok(Arc::new(Inner {
        name,
        uri,
        opts,
        info,
        link,
        reconnects: AtomicU64::new(0),
        retried: AtomicU64::new(0),
        closed: AtomicBool::new(false),
        last_answer: AtomicU64::new(0),
        epoch: Instant::now(),
    }))
}

/// Stop a member: requests waiting for a link, and those in flight, end as "closed".
fn shut(inner: &Inner) {
    inner.closed.store(true, Relaxed);
    let old = inner.link.send_replace(Link::Closed);
    if let Link::Up { conns, .. } = old {
        for c in conns.iter() {
            c.close();
        }
    }
}

/// Counters of a remote member's link.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// New connections made after the first.
    pub reconnects: u64,
    /// Requests sent again after their connection died.
    pub retried: u64,
}

impl RemoteDev {
    /// Connect to the export `uri` names (waits for the first connection; an export that
    /// cannot be reached now is an error).
    pub fn open(uri: &str, opts: RemoteOptions) -> io::Result<Arc<RemoteDev>> {
        let parsed =
            NbdUri::parse(uri).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let name = uri.to_string();
        if let Some(handle) = shared_runtime()? {
            let inner = tokio::task::block_in_place(|| handle.block_on(start(name, parsed, opts)))?;
            let sup = handle.spawn(supervise(inner.clone()));
            return Ok(Arc::new(RemoteDev {
                inner,
                exec: Exec::Shared {
                    handle,
                    supervisor: Mutex::new(Some(sup)),
                },
            }));
        }
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (tx, rx) = mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name(format!("sbod-nbd:{}", parsed.export))
            .spawn({
                let name = name.clone();
                move || {
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    rt.block_on(async move {
                        let inner = match start(name, parsed, opts).await {
                            Ok(i) => i,
                            Err(e) => {
                                let _ = ready_tx.send(Err(e));
                                return;
                            }
                        };
                        if ready_tx.send(Ok(inner.clone())).is_err() {
                            return;
                        }
                        run(inner, rx).await;
                    });
                }
            })?;
        let inner = ready_rx
            .recv()
            .map_err(|_| io::Error::other(format!("{name}: the member's thread died")))??;
        Ok(Arc::new(RemoteDev {
            inner,
            exec: Exec::Own {
                tx,
                thread: Mutex::new(Some(thread)),
            },
        }))
    }

    /// Whether the member's tasks run on the runtime it was opened in (rather than on a
    /// thread of its own).
    pub fn shares_runtime(&self) -> bool {
        matches!(self.exec, Exec::Shared { .. })
    }

    pub fn uri(&self) -> &NbdUri {
        &self.inner.uri
    }

    /// The export as its server describes it.
    pub fn info(&self) -> &sbod_nbd::ExportInfo {
        &self.inner.info
    }

    /// How many connections carry requests (1 unless the export allows multi-conn).
    pub fn connections(&self) -> usize {
        match &*self.inner.link.borrow() {
            Link::Up { conns, .. } => conns.len(),
            _ => 0,
        }
    }

    pub fn link(&self) -> LinkState {
        match &*self.inner.link.borrow() {
            Link::Up { .. } => LinkState::Up,
            Link::Reconnecting { why, .. } => LinkState::Reconnecting { why: why.clone() },
            Link::Down { why } => LinkState::Unreachable { why: why.clone() },
            Link::Closed => LinkState::Closed,
        }
    }

    pub fn stats(&self) -> LinkStats {
        LinkStats {
            reconnects: self.inner.reconnects.load(Relaxed),
            retried: self.inner.retried.load(Relaxed),
        }
    }
}

impl BlockDev for RemoteDev {
    fn submit(&self, req: IoReq, done: Done) {
        let c = Completion(Some(done));
        if self.inner.opts.read_only && !matches!(req.kind, IoKind::Read { .. }) {
            return c.finish(Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is open read-only", self.inner.name),
            )));
        }
        match &self.exec {
            // If the member's thread is gone the message comes back and drops: "closed".
            Exec::Own { tx, .. } => {
                let _ = tx.send(Msg::Io(req, c));
            }
            Exec::Shared { handle, .. } => {
                if self.inner.closed.load(Relaxed) {
                    return c.finish(Err(io::Error::other("member is closed")));
                }
                handle.spawn(handle_req(self.inner.clone(), req, c));
            }
        }
    }

    fn size(&self) -> u64 {
        self.inner.info.size
    }

    fn name(&self) -> &str {
        &self.inner.name
    }

    fn close(&self) {
        if self.inner.closed.swap(true, Relaxed) {
            return;
        }
        match &self.exec {
            Exec::Own { tx, thread } => {
                let _ = tx.send(Msg::Close);
                let t = thread.lock().take();
                if let Some(t) = t {
                    // A completion callback may close its own member: never join ourselves.
                    if t.thread().id() != std::thread::current().id() {
                        let _ = t.join();
                    }
                }
            }
            Exec::Shared { supervisor, .. } => {
                shut(&self.inner);
                if let Some(t) = supervisor.lock().take() {
                    t.abort();
                }
            }
        }
    }

    fn queue(&self) -> &'static str {
        "nbd"
    }

    fn link_up(&self) -> Option<bool> {
        Some(match &*self.inner.link.borrow() {
            Link::Up { .. } | Link::Reconnecting { .. } => true,
            Link::Down { .. } | Link::Closed => false,
        })
    }
}

impl Drop for RemoteDev {
    fn drop(&mut self) {
        self.close();
    }
}

fn client_options(opts: &RemoteOptions) -> ClientOptions {
    ClientOptions {
        connect_timeout: opts.connect_timeout,
        io_timeout: opts.io_timeout,
        tls: None,
    }
}

/// Open the member's connections: one, or `opts.connections` when the export allows
/// multi-conn. `expect`: the export as first seen (a server now offering another size is
/// another disk, and is refused).
async fn connect_all(
    uri: &NbdUri,
    opts: &RemoteOptions,
    expect: Option<&sbod_nbd::ExportInfo>,
) -> io::Result<Vec<Connection<Buf>>> {
    let mut copts = client_options(opts);
    if uri.tls {
        copts.tls = Some(sbod_nbd::client::tls_config(uri)?);
    }
    let first: Connection<Buf> = Connection::connect(uri, &copts)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("{uri}: {e}")))?;
    let info = first.info().clone();
    if let Some(x) = expect {
        if x.size != info.size {
            return Err(io::Error::other(format!(
                "{uri}: the export now has {} bytes, not {}: another disk?",
                info.size, x.size
            )));
        }
    }
    if info.min_block > 4096 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{uri}: the export's minimum block is {} bytes; sbod members need 4096 or less",
                info.min_block
            ),
        ));
    }
    if info.read_only && !opts.read_only {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{uri}: the export is read-only"),
        ));
    }
    let mut conns = vec![first];
    if info.can_multi_conn {
        let more = futures::future::join_all(
            (1..opts.connections).map(|_| Connection::<Buf>::connect(uri, &copts)),
        )
        .await;
        for c in more {
            conns.push(c.map_err(|e| io::Error::new(e.kind(), format!("{uri}: {e}")))?);
        }
    }
    Ok(conns)
}

/// The member's thread: take requests, keep the link.
async fn run(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let sup = tokio::spawn(supervise(inner.clone()));
    while let Some(m) = rx.recv().await {
        match m {
            Msg::Io(req, done) => {
                tokio::spawn(handle_req(inner.clone(), req, done));
            }
            Msg::Close => break,
        }
    }
    shut(&inner);
    sup.abort();
    // Requests still queued complete as "closed" as their Completion drops.
    rx.close();
    while rx.try_recv().is_ok() {}
}

/// Keep the member's connections: notice when one dies, reconnect with back-off, declare
/// the member unreachable after `give_up`, and probe an idle link.
async fn supervise(inner: Arc<Inner>) {
    let opts = &inner.opts;
    let probe_every = (opts.io_timeout / 2).max(Duration::from_millis(50));
    let mut generation = 1;
    loop {
        let Link::Up { conns, .. } = inner.link.borrow().clone() else {
            return;
        };
        // Wait for a connection to end, probing the link while nothing else uses it.
        let death = loop {
            let any_dead = futures::future::select_all(conns.iter().map(|c| Box::pin(c.closed())));
            tokio::select! {
                (d, _, _) = any_dead => break d,
                _ = tokio::time::sleep(probe_every) => {
                    if conns.iter().all(|c| c.load() == 0) {
                        let c = &conns[0];
                        let buf = Buf(AlignedBuf::zeroed(4096).into_shared());
                        // Its outcome does not matter: a silent link trips the
                        // connection's watchdog, which ends the connection.
                        let probe = c.request(Command::Read { offset: 0, buf });
                        tokio::select! {
                            o = probe => if !matches!(o, Outcome::Lost(_)) { inner.answered() },
                            _ = c.closed() => {}
                        }
                    }
                }
            }
        };
        for c in conns.iter() {
            c.close();
        }
        drop(conns);
        if inner.closed.load(Relaxed) {
            return;
        }
        let since = Instant::now();
        let why = format!("{}: {death}", inner.uri);
        if matches!(death, Death::Protocol(_)) {
            tracing::error!(member = %inner.name, "{why}; the member is unreachable until its server is fixed");
            inner.link.send_replace(Link::Down { why: why.clone() });
            // Replies from this server cannot be trusted: do not hammer it.
            tokio::time::sleep(opts.give_up).await;
        } else if inner.silent_for() >= opts.give_up {
            give_up(&inner, &why);
        } else {
            tracing::warn!(member = %inner.name, "{why}; reconnecting");
            inner
                .link
                .send_replace(Link::Reconnecting { why: why.clone() });
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            if inner.closed.load(Relaxed) {
                return;
            }
            match connect_all(&inner.uri, opts, Some(&inner.info)).await {
                Ok(c) => {
                    generation += 1;
                    inner.reconnects.fetch_add(1, Relaxed);
                    tracing::info!(
                        member = %inner.name,
                        after_ms = since.elapsed().as_millis() as u64,
                        "reconnected"
                    );
                    if inner.closed.load(Relaxed) {
                        return;
                    }
                    inner.link.send_replace(Link::Up {
                        generation,
                        conns: Arc::new(c),
                    });
                    break;
                }
                Err(e) => {
                    let last = e.to_string();
                    let down = matches!(&*inner.link.borrow(), Link::Down { .. });
                    if !down && inner.silent_for() >= opts.give_up {
                        give_up(&inner, &last);
                    } else if !down {
                        inner.link.send_modify(|l| {
                            if let Link::Reconnecting { why } = l {
                                why.clone_from(&last);
                            }
                        });
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

fn give_up(inner: &Inner, last: &str) {
    let why = format!(
        "unreachable: no answer for {:.1} s ({last})",
        inner.silent_for().as_secs_f64()
    );
    tracing::error!(member = %inner.name, "{why}");
    inner.link.send_replace(Link::Down { why });
}

/// Wait for a connection set newer than `min_generation`, or say why there is none.
async fn wait_up(inner: &Inner, min_generation: u64) -> io::Result<(u64, Conns)> {
    let mut rx = inner.link.subscribe();
    loop {
        match &*rx.borrow_and_update() {
            Link::Up { generation, conns } if *generation >= min_generation => {
                return Ok((*generation, conns.clone()))
            }
            Link::Down { why } => return Err(dev::unreachable(why.clone())),
            Link::Closed => return Err(io::Error::other("member is closed")),
            _ => {}
        }
        if rx.changed().await.is_err() {
            return Err(io::Error::other("member is closed"));
        }
    }
}

/// Send one command until it is answered, moving to new connections as old ones die.
async fn send(inner: &Inner, mut cmd: Command<Buf>) -> io::Result<()> {
    let mut min_generation = 0;
    loop {
        let (generation, conns) = wait_up(inner, min_generation).await?;
        // The least loaded connection.
        let c = conns
            .iter()
            .min_by_key(|c| c.load())
            .expect("at least one connection");
        let out = c.request(cmd).await;
        if !matches!(out, Outcome::Lost(_)) {
            inner.answered();
        }
        match out {
            Outcome::Done(_) => return Ok(()),
            Outcome::Failed(back, e) if e.raw_os_error() == Some(libc::ESHUTDOWN) => {
                // The server is going away: like a lost connection.
                c.close();
                cmd = back;
            }
            Outcome::Failed(_, e) => return Err(e),
            Outcome::Lost(back) => cmd = back,
        }
        inner.retried.fetch_add(1, Relaxed);
        min_generation = generation + 1;
    }
}

/// Largest WRITE_ZEROES/TRIM length sent at once.
const ZERO_STEP: u64 = 1 << 30;

async fn handle_req(inner: Arc<Inner>, req: IoReq, done: Completion) {
    let r = execute(&inner, req).await;
    done.finish(r);
}

async fn execute(inner: &Inner, req: IoReq) -> io::Result<()> {
    let info = &inner.info;
    let max = info.max_payload as usize;
    match req.kind {
        IoKind::Read { buf } => {
            let parts = pieces(&buf, req.offset, max)
                .map(|(offset, b)| send(inner, Command::Read { offset, buf: b }));
            join_ok(parts).await
        }
        IoKind::Write { buf, fua } => {
            let native_fua = fua && info.can_fua;
            let parts = pieces(&buf, req.offset, max).map(|(offset, b)| {
                send(
                    inner,
                    Command::Write {
                        offset,
                        buf: b,
                        fua: native_fua,
                    },
                )
            });
            join_ok(parts).await?;
            if fua && !native_fua && info.can_flush {
                send(inner, Command::Flush).await?;
            }
            Ok(())
        }
        IoKind::Flush => {
            if info.can_flush {
                send(inner, Command::Flush).await
            } else {
                Ok(())
            }
        }
        IoKind::Zero { len, punch } => {
            if info.can_write_zeroes {
                let step = ZERO_STEP / info.min_block as u64 * info.min_block as u64;
                let parts = (0..len).step_by(step as usize).map(|at| {
                    send(
                        inner,
                        Command::WriteZeroes {
                            offset: req.offset + at,
                            len: (len - at).min(step) as u32,
                            fua: false,
                            no_hole: !punch,
                        },
                    )
                });
                join_ok(parts).await
            } else if len > 0 {
                // Write real zeros, a payload at a time.
                let zeros = AlignedBuf::zeroed(max.min(len as usize)).into_shared();
                let mut at = 0u64;
                while at < len {
                    let n = (len - at).min(max as u64) as usize;
                    send(
                        inner,
                        Command::Write {
                            offset: req.offset + at,
                            buf: Buf(zeros.slice(0..n)),
                            fua: false,
                        },
                    )
                    .await?;
                    at += n as u64;
                }
                Ok(())
            } else {
                Ok(())
            }
        }
    }
}

/// A request's buffer cut into payloads the server accepts, with their offsets.
fn pieces(buf: &SharedBuf, offset: u64, max: usize) -> impl Iterator<Item = (u64, Buf)> + '_ {
    (0..buf.len()).step_by(max).map(move |at| {
        (
            offset + at as u64,
            Buf(buf.slice(at..(at + max).min(buf.len()))),
        )
    })
}

async fn join_ok(
    parts: impl Iterator<Item = impl std::future::Future<Output = io::Result<()>>>,
) -> io::Result<()> {
    for r in futures::future::join_all(parts).await {
        r?;
    }
    Ok(())
}
