//! The server: listeners, the handshake, and the transmission phase.
//!
//! Per connection, one task reads requests and runs each in its own task (so one slow
//! request never holds up others; replies go out in completion order); a small request
//! that completes at its first poll is answered from the reader without a task of its own.
//! One task writes replies, coalescing small ones. A malformed request closes only its own
//! connection.
//!
//! No client can exhaust the server ([`Limits`], docs/RELIABILITY.md "Hostile input"): request
//! payloads in flight draw on one byte budget shared by every connection, taken before a
//! WRITE's buffer is allocated and held until its write completes (a READ's until its data
//! is sent); connections are counted, server-wide and per client address, and those beyond
//! the limit are told why; a handshake, a started request and a batch of replies each have a
//! deadline, so a client that stalls holds nothing for long.

use crate::backend::{Backend, ExportInfo, NbdError};
use crate::proto::*;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout, timeout_at, Instant};

/// Where to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl Listen {
    /// `unix:PATH` or `tcp:HOST:PORT`. Addresses other than loopback need `allow_remote`.
    pub fn parse(s: &str, allow_remote: bool) -> Result<Listen, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/run/sbod/vol0.sock".into());
            }
            return Ok(Listen::Unix(PathBuf::from(p)));
        }
        if let Some(hp) = s.strip_prefix("tcp:") {
            let addr: SocketAddr = hp
                .to_socket_addrs()
                .map_err(|e| format!("'{hp}' is not HOST:PORT ({e})"))?
                .next()
                .ok_or_else(|| format!("'{hp}' resolves to no address"))?;
            if !addr.ip().is_loopback() && !allow_remote {
                return Err(format!(
                    "{addr} is not a loopback address: NBD has no authentication, so sbod listens beyond this host only when asked (--allow-remote)"
                ));
            }
            return Ok(Listen::Tcp(addr));
        }
        Err(format!("'{s}': listen on unix:PATH or tcp:HOST:PORT"))
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
            Listen::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// Counters for metrics.
#[derive(Default, Debug)]
pub struct Stats {
    pub connections: AtomicU64,
    pub active: AtomicU64,
    pub requests: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Connections dropped for breaking the protocol.
    pub protocol_errors: AtomicU64,
    /// Connections refused for the connection limits.
    pub refused: AtomicU64,
    /// Connections closed for a deadline: handshake, request, replies, idle.
    pub timeouts: AtomicU64,
    /// Bytes of the shared payload budget held now.
    pub inflight_bytes: AtomicU64,
}

/// What keeps clients from exhausting the server. Every field has a default fit for a
/// served array; `sbod serve` and `sbod export` set them from their flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of request payload held at once by all connections together: a WRITE's from
    /// when its header is read (before its buffer is allocated) until the write completes,
    /// a READ's until its data is sent. A request waits for budget; none allocates beyond
    /// it. At least the largest request an export accepts (its max payload).
    pub inflight_bytes: u64,
    /// Connections at once, over all listeners (those in the handshake included).
    pub max_connections: usize,
    /// Connections at once from one IP address (TCP; a Unix socket's clients are local).
    pub max_per_client: usize,
    /// A connection that has not finished the handshake (TLS included) by then is closed.
    pub handshake_timeout: Duration,
    /// Once a request's first byte arrives, its header and WRITE payload must follow within
    /// this, and the client must take each batch of replies within this; else the
    /// connection is closed (its budget returns).
    pub io_timeout: Duration,
    /// Close a connection with nothing in flight that sends nothing for this long. `None`
    /// (the default): never, as the kernel's client may sit idle for days and takes a
    /// closed connection for a dead server.
    pub idle_timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            inflight_bytes: 512 << 20,
            max_connections: 512,
            max_per_client: 128,
            handshake_timeout: Duration::from_secs(30),
            io_timeout: Duration::from_secs(60),
            idle_timeout: None,
        }
    }
}

/// Bytes of request payload in flight per connection (reads and writes), within the
/// server-wide budget, so one connection cannot take it all.
const INFLIGHT_BUDGET: u32 = 256 << 20;
/// Socket buffers of a connection in the handshake, and in transmission.
const HANDSHAKE_BUF: usize = 4096;
const IO_BUF: usize = 256 * 1024;
/// Connections beyond the limits being told why at once; more are closed unanswered.
const REFUSING: usize = 64;
/// The longest a refused connection is kept to read the reason.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests in flight per connection.
const INFLIGHT_REQUESTS: usize = 512;
/// Requests up to this many bytes are first polled on the connection's reader task.
const INLINE_POLL_MAX: u32 = 64 << 10;
/// Replies of requests answered inline that wait for one write at most.
const ANSWER_BATCH: usize = 64;
/// A WRITE payload over the export's limit is drained (to keep the stream in sync) up to
/// this size; beyond it the connection is dropped as a denial of service.
const DRAIN_LIMIT: u32 = 64 << 20;

pub struct Server<B: Backend> {
    exports: Arc<Vec<(String, Arc<B>)>>,
    stats: Arc<Stats>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
}

/// What every connection of a server shares.
struct Shared<B> {
    exports: Arc<Vec<(String, Arc<B>)>>,
    stats: Arc<Stats>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    /// The server-wide payload budget, in bytes.
    budget: Arc<Semaphore>,
    admission: Arc<Admission>,
    refusing: Arc<Semaphore>,
}

/// Counts connections against the limits.
struct Admission {
    max: usize,
    per_client: usize,
    /// Open connections, and those per client address.
    open: parking_lot::Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One admitted connection; dropping it frees its place.
struct Ticket {
    adm: Arc<Admission>,
    ip: Option<IpAddr>,
}

impl Admission {
    fn admit(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<Ticket, String> {
        let mut open = self.open.lock();
        if open.0 >= self.max {
            return Err(format!(
                "sbod: the server's connection limit ({}) is reached; try again when a \
                 connection closes",
                self.max
            ));
        }
        if let Some(ip) = ip {
            let n = open.1.get(&ip).copied().unwrap_or(0);
            if n >= self.per_client {
                return Err(format!(
                    "sbod: the limit of {} connections from {ip} is reached; close one first",
                    self.per_client
                ));
            }
            open.1.insert(ip, n + 1);
        }
        open.0 += 1;
        Ok(Ticket {
            adm: self.clone(),
            ip,
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.adm.open.lock();
        open.0 -= 1;
        if let Some(ip) = self.ip {
            if let Some(n) = open.1.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    open.1.remove(&ip);
                }
            }
        }
    }
}

/// Budget held by one request: returned (and the gauge lowered) on drop.
struct Held {
    _conn: OwnedSemaphorePermit,
    _all: OwnedSemaphorePermit,
    stats: Arc<Stats>,
    bytes: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stats.inflight_bytes.fetch_sub(self.bytes, Relaxed);
    }
}

struct Negotiated<B> {
    export: Arc<B>,
    info: ExportInfo,
    framing: Framing,
    /// The client promised to honour our block size constraints.
    sized: bool,
    /// `base:allocation` was selected for this export (NBD_OPT_SET_META_CONTEXT).
    allocation: bool,
}

/// How replies are framed: simple, structured, or extended headers (which take over
/// from structured replies and carry 64-bit lengths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Framing {
    structured: bool,
    extended: bool,
}

impl Framing {
    /// Chunks (structured or extended) may be sent.
    fn chunks(self) -> bool {
        self.structured || self.extended
    }
}

enum Reply<Buf> {
    Simple {
        cookie: u64,
        offset: u64,
        error: u32,
    },
    Data {
        cookie: u64,
        offset: u64,
        data: Buf,
    },
    /// A `base:allocation` answer: (length, status flags) from `offset`.
    Status {
        cookie: u64,
        offset: u64,
        extents: Vec<(u64, u32)>,
    },
    Err {
        cookie: u64,
        offset: u64,
        error: u32,
        /// Sent as an error chunk when chunks are on (READ and BLOCK_STATUS, whose
        /// replies are chunks); others take a simple reply.
        chunk: bool,
        msg: &'static str,
    },
}

impl<B: Backend> Server<B> {
    /// Serve these exports; the first is also the default export ("").
    pub fn new(exports: Vec<(String, Arc<B>)>) -> Server<B> {
        assert!(!exports.is_empty(), "a server needs an export");
        Server {
            exports: Arc::new(exports),
            stats: Arc::new(Stats::default()),
            tls: None,
            limits: Limits::default(),
        }
    }

    /// Serve within these limits instead of the defaults.
    pub fn with_limits(mut self, limits: Limits) -> Server<B> {
        self.limits = limits;
        self
    }

    /// Require TLS (NBD_OPT_STARTTLS) before any export is shown or served.
    pub fn with_tls(mut self, cfg: Arc<tokio_rustls::rustls::ServerConfig>) -> Server<B> {
        self.tls = Some(tokio_rustls::TlsAcceptor::from(cfg));
        self
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Listen and serve until `shutdown` completes; then finish in-flight requests,
    /// flush every export and close.
    pub async fn serve(
        self,
        listen: Vec<Listen>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> io::Result<()> {
        let l = &self.limits;
        let largest = self.exports.iter().map(|(_, e)| e.info().max_payload).max();
        if let Some(m) = largest.filter(|&m| (m as u64) > l.inflight_bytes) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the in-flight budget ({} bytes) is below the largest request an export \
                     accepts ({m} bytes): raise the budget",
                    l.inflight_bytes
                ),
            ));
        }
        if l.max_connections == 0 || l.max_per_client == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the connection limits must allow at least one connection",
            ));
        }
        let shared = Arc::new(Shared {
            exports: self.exports.clone(),
            stats: self.stats.clone(),
            tls: self.tls.clone(),
            limits: l.clone(),
            budget: Arc::new(Semaphore::new(
                l.inflight_bytes.min(Semaphore::MAX_PERMITS as u64) as usize,
            )),
            admission: Arc::new(Admission {
                max: l.max_connections,
                per_client: l.max_per_client,
                open: Default::default(),
            }),
            refusing: Arc::new(Semaphore::new(REFUSING)),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut accepts = tokio::task::JoinSet::new();
        let conns = Arc::new(tokio::sync::Mutex::new(tokio::task::JoinSet::new()));
        let mut unix_paths = Vec::new();
        for l in &listen {
            let (shared, mut stop, conns) = (shared.clone(), stop_rx.clone(), conns.clone());
            match l {
                Listen::Unix(p) => {
                    if p.exists() {
                        if std::os::unix::net::UnixStream::connect(p).is_ok() {
                            return Err(io::Error::new(
                                io::ErrorKind::AddrInUse,
                                format!("{} is in use by another server", p.display()),
                            ));
                        }
                        let _ = std::fs::remove_file(p);
                    }
                    let lst = UnixListener::bind(p).map_err(|e| {
                        io::Error::new(e.kind(), format!("binding {}: {e}", p.display()))
                    })?;
                    unix_paths.push(p.clone());
                    accepts.spawn(async move {
                        loop {
                            tokio::select! {
                                _ = stop.changed() => break,
                                r = lst.accept() => match r {
                                    Ok((s, _)) => admit(s, None, &shared, &stop, &conns).await,
                                    Err(e) => accept_failed(e).await,
                                }
                            }
                        }
                    });
                }
                Listen::Tcp(a) => {
                    let lst = TcpListener::bind(a)
                        .await
                        .map_err(|e| io::Error::new(e.kind(), format!("binding {a}: {e}")))?;
                    accepts.spawn(async move {
                        loop {
                            tokio::select! {
                                _ = stop.changed() => break,
                                r = lst.accept() => match r {
                                    Ok((s, peer)) => {
                                        let _ = s.set_nodelay(true);
                                        admit(s, Some(peer.ip()), &shared, &stop, &conns).await
                                    }
                                    Err(e) => accept_failed(e).await,
                                }
                            }
                        }
                    });
                }
            }
        }
        shutdown.await;
        let _ = stop_tx.send(true);
        while accepts.join_next().await.is_some() {}
        let mut c = conns.lock().await;
        while c.join_next().await.is_some() {}
        let mut result = Ok(());
        for (name, e) in self.exports.iter() {
            if let Err(err) = e.flush().await {
                tracing::error!(export = %name, error = %err, "flush at shutdown failed");
                result = Err(io::Error::other(format!(
                    "flushing export {name} at shutdown: {err}"
                )));
            }
        }
        for p in unix_paths {
            let _ = std::fs::remove_file(p);
        }
        result
    }
}

/// Start serving an accepted connection, or refuse it (with the reason, when few are
/// being refused at once) if it is beyond the limits.
async fn admit<S, B>(
    s: S,
    ip: Option<IpAddr>,
    shared: &Arc<Shared<B>>,
    stop: &watch::Receiver<bool>,
    conns: &tokio::sync::Mutex<tokio::task::JoinSet<()>>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: Backend,
{
    match shared.admission.admit(ip) {
        Ok(ticket) => {
            let fut = connection(s, shared.clone(), stop.clone(), ticket);
            let mut set = conns.lock().await;
            // Finished connections are reaped here: a JoinSet keeps each until joined.
            while set.try_join_next().is_some() {}
            set.spawn(fut);
        }
        Err(why) => {
            // Logged the 1st, 2nd, 4th, 8th... time: a flood cannot flood the log.
            let n = shared.stats.refused.fetch_add(1, Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(client = ?ip, refused = n, "NBD connection refused: {why}");
            }
            if let Ok(p) = shared.refusing.clone().try_acquire_owned() {
                let t = shared.limits.handshake_timeout.min(REFUSE_TIMEOUT);
                conns.lock().await.spawn(async move {
                    let _ = timeout(t, refuse(s, why)).await;
                    drop(p);
                });
            }
        }
    }
}

/// An accept that failed (e.g. out of file descriptors): wait a little rather than spin.
async fn accept_failed(e: io::Error) {
    tracing::warn!(error = %e, "accepting an NBD connection failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Tell a connection beyond the limits why it is refused: every option is answered
/// NBD_REP_ERR_POLICY with the reason (what libnbd shows its user), until the client gives
/// up. An EXPORT_NAME cannot be answered but by closing.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, why: String) -> io::Result<()> {
    greet(&mut s).await?;
    for _ in 0..8 {
        let magic = s.read_u64().await?;
        if magic != IHAVEOPT {
            break;
        }
        let opt = s.read_u32().await?;
        let len = s.read_u32().await?;
        if len > MAX_OPTION_LEN {
            break;
        }
        tokio::io::copy(&mut (&mut s).take(len as u64), &mut tokio::io::sink()).await?;
        match opt {
            OPT_EXPORT_NAME => break,
            OPT_ABORT => {
                s.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                s.flush().await?;
                break;
            }
            _ => {
                s.write_all(&option_reply(opt, REP_ERR_POLICY, why.as_bytes()))
                    .await?;
                s.flush().await?;
            }
        }
    }
    Ok(())
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_string())
}

async fn connection<S, B>(
    mut stream: S,
    shared: Arc<Shared<B>>,
    stop: watch::Receiver<bool>,
    ticket: Ticket,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: Backend,
{
    let stats = shared.stats.clone();
    stats.connections.fetch_add(1, Relaxed);
    stats.active.fetch_add(1, Relaxed);
    let mut stop2 = stop.clone();
    // The whole handshake, TLS included, has one deadline.
    let deadline = Instant::now() + shared.limits.handshake_timeout;
    let late = || timed_out("the client did not finish the handshake in time");
    // Until the handshake is over, a server shutting down just drops the connection.
    let r = async {
        let no_zeroes = tokio::select! {
            n = timeout_at(deadline, greet(&mut stream)) => n.map_err(|_| late())??,
            _ = stop2.changed() => return Ok(()),
        };
        match shared.tls.clone() {
            None => session(stream, no_zeroes, false, &shared, deadline, stop).await,
            Some(acceptor) => {
                let s = tokio::select! {
                    s = timeout_at(deadline, async {
                        if !require_tls(&mut stream).await? {
                            return Ok(None);
                        }
                        acceptor.accept(stream).await.map(Some)
                    }) => s.map_err(|_| late())??,
                    _ = stop2.changed() => return Ok(()),
                };
                match s {
                    Some(s) => session(s, no_zeroes, true, &shared, deadline, stop).await,
                    None => Ok(()),
                }
            }
        }
    }
    .await;
    if let Err(e) = r {
        match e.kind() {
            io::ErrorKind::InvalidData => {
                stats.protocol_errors.fetch_add(1, Relaxed);
            }
            io::ErrorKind::TimedOut => {
                stats.timeouts.fetch_add(1, Relaxed);
            }
            _ => {}
        }
        tracing::debug!(error = %e, "connection ended");
    }
    stats.active.fetch_sub(1, Relaxed);
    drop(ticket);
}

/// Negotiate and serve one (possibly TLS) stream.
async fn session<S, B>(
    stream: S,
    no_zeroes: bool,
    tls_done: bool,
    shared: &Arc<Shared<B>>,
    deadline: Instant,
    stop: watch::Receiver<bool>,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: Backend,
{
    let (r, w) = tokio::io::split(stream);
    // Small buffers until the handshake is over: a connection that never finishes it
    // costs little (the transmission's large ones are made after).
    let mut r = BufReader::with_capacity(HANDSHAKE_BUF, r);
    let mut w = BufWriter::with_capacity(HANDSHAKE_BUF, w);
    let mut stop2 = stop.clone();
    let hs = tokio::select! {
        h = timeout_at(deadline, handshake(&mut r, &mut w, &shared.exports, no_zeroes, tls_done)) => {
            h.map_err(|_| timed_out("the client did not finish the handshake in time"))?
        }
        _ = stop2.changed() => Ok(None),
    };
    let stats = shared.stats.clone();
    match hs {
        Ok(Some(neg)) => {
            // What the client sent after its GO is read first; the handshake flushed
            // everything it wrote.
            debug_assert!(w.buffer().is_empty());
            let early = std::io::Cursor::new(r.buffer().to_vec());
            let r = BufReader::with_capacity(IO_BUF, early.chain(r.into_inner()));
            let w = BufWriter::with_capacity(IO_BUF, w.into_inner());
            transmission(r, w, neg, shared.clone(), stop).await
        }
        Ok(None) => Ok(()),
        Err(e) => {
            stats.protocol_errors.fetch_add(1, Relaxed);
            tracing::debug!(error = %e, "handshake failed");
            Ok(())
        }
    }
}

/// The server's greeting and the client's flags. Returns whether the client asked for no
/// zero padding.
async fn greet<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> io::Result<bool> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello).await?;
    s.flush().await?;
    let cflags = s.read_u32().await?;
    if cflags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(proto_err(format!("unknown client flags {cflags:#x}")));
    }
    Ok(cflags & FLAG_C_NO_ZEROES != 0)
}

/// With TLS required, answer every option but ABORT with "TLS required" until the client
/// asks for STARTTLS. `Ok(false)`: the client left.
async fn require_tls<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> io::Result<bool> {
    loop {
        let magic = s.read_u64().await?;
        if magic != IHAVEOPT {
            return Err(proto_err(format!("bad option magic {magic:#x}")));
        }
        let opt = s.read_u32().await?;
        let len = s.read_u32().await?;
        if len > MAX_OPTION_LEN {
            return Err(proto_err(format!("option of {len} bytes before TLS")));
        }
        tokio::io::copy(&mut (&mut *s).take(len as u64), &mut tokio::io::sink()).await?;
        match opt {
            OPT_STARTTLS if len == 0 => {
                s.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                s.flush().await?;
                return Ok(true);
            }
            OPT_ABORT => {
                s.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                s.flush().await?;
                return Ok(false);
            }
            OPT_EXPORT_NAME => {
                return Err(proto_err("EXPORT_NAME without TLS on a TLS-only server"));
            }
            _ => {
                s.write_all(&option_reply(
                    opt,
                    REP_ERR_TLS_REQD,
                    b"this server requires TLS (nbds://)",
                ))
                .await?;
                s.flush().await?;
            }
        }
    }
}

fn proto_err(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn transmission_flags(info: &ExportInfo, chunks: bool) -> u16 {
    let mut f = TF_HAS_FLAGS;
    if info.read_only {
        f |= TF_READ_ONLY;
    }
    if info.can_flush {
        f |= TF_SEND_FLUSH;
    }
    if info.can_fua {
        f |= TF_SEND_FUA;
    }
    if info.can_trim && !info.read_only {
        f |= TF_SEND_TRIM;
    }
    if info.can_write_zeroes && !info.read_only {
        f |= TF_SEND_WRITE_ZEROES | TF_SEND_FAST_ZERO;
    }
    f |= TF_SEND_CACHE;
    if info.can_multi_conn {
        f |= TF_CAN_MULTI_CONN;
    }
    if chunks {
        // Reads are always answered in one chunk, so "don't fragment" holds trivially.
        f |= TF_SEND_DF;
    }
    f
}

/// The fixed newstyle handshake. `Ok(None)`: the client left (ABORT or EOF).
async fn handshake<R, W, B>(
    r: &mut R,
    w: &mut W,
    exports: &[(String, Arc<B>)],
    no_zeroes: bool,
    tls_done: bool,
) -> io::Result<Option<Negotiated<B>>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    B: Backend,
{
    let mut structured = false;
    let mut extended = false;
    // The export `base:allocation` was selected for by the last SET_META_CONTEXT.
    let mut meta: Option<Arc<B>> = None;
    let find = |name: &str| -> Option<&Arc<B>> {
        if name.is_empty() {
            return exports.first().map(|(_, e)| e);
        }
        exports.iter().find(|(n, _)| n == name).map(|(_, e)| e)
    };
    loop {
        let magic = r.read_u64().await?;
        if magic != IHAVEOPT {
            return Err(proto_err(format!("bad option magic {magic:#x}")));
        }
        let opt = r.read_u32().await?;
        let len = r.read_u32().await?;
        if len > MAX_OPTION_LEN {
            // Too big to be honest: refuse, and drop the connection if it is absurd.
            if len > 16 * MAX_OPTION_LEN {
                return Err(proto_err(format!("option of {len} bytes")));
            }
            tokio::io::copy(&mut (&mut *r).take(len as u64), &mut tokio::io::sink()).await?;
            w.write_all(&option_reply(opt, REP_ERR_TOO_BIG, b"option too large"))
                .await?;
            w.flush().await?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        r.read_exact(&mut data).await?;
        match opt {
            OPT_EXPORT_NAME => {
                if extended {
                    // The spec forbids it (its reply could not say the framing).
                    return Err(proto_err("EXPORT_NAME after EXTENDED_HEADERS"));
                }
                let name = String::from_utf8_lossy(&data).to_string();
                let Some(e) = find(&name) else {
                    // The spec gives no way to report this but closing.
                    return Err(proto_err(format!("unknown export '{name}'")));
                };
                let info = e.info();
                let mut out = Vec::with_capacity(10 + 124);
                out.extend_from_slice(&info.size.to_be_bytes());
                out.extend_from_slice(&transmission_flags(&info, structured).to_be_bytes());
                if !no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                w.write_all(&out).await?;
                w.flush().await?;
                let allocation = meta.as_ref().is_some_and(|m| Arc::ptr_eq(m, e));
                return Ok(Some(Negotiated {
                    export: e.clone(),
                    info,
                    framing: Framing {
                        structured,
                        extended: false,
                    },
                    sized: false,
                    allocation,
                }));
            }
            OPT_ABORT => {
                w.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                w.flush().await?;
                return Ok(None);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    w.write_all(&option_reply(opt, REP_ERR_INVALID, b"LIST takes no data"))
                        .await?;
                } else {
                    for (name, _) in exports {
                        let mut d = (name.len() as u32).to_be_bytes().to_vec();
                        d.extend_from_slice(name.as_bytes());
                        w.write_all(&option_reply(opt, REP_SERVER, &d)).await?;
                    }
                    w.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                }
            }
            OPT_EXTENDED_HEADERS => {
                if !data.is_empty() {
                    w.write_all(&option_reply(
                        opt,
                        REP_ERR_INVALID,
                        b"EXTENDED_HEADERS takes no data",
                    ))
                    .await?;
                } else {
                    extended = true;
                    w.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let set = opt == OPT_SET_META_CONTEXT;
                if set {
                    // A SET replaces what was selected, also when it fails.
                    meta = None;
                }
                let reply = match parse_meta_request(&data) {
                    _ if !structured && !extended => Err((
                        REP_ERR_INVALID,
                        "negotiate structured replies or extended headers first".to_string(),
                    )),
                    None => Err((REP_ERR_INVALID, "malformed meta context request".into())),
                    Some(q) => match find(&q.name) {
                        None => Err((REP_ERR_UNKNOWN, format!("no export named '{}'", q.name))),
                        Some(e) => {
                            // LIST: no query, `base:` or `base:allocation` lists it; SET:
                            // only `base:allocation` selects it. Others are ignored.
                            let hit = q
                                .queries
                                .iter()
                                .any(|x| x == META_BASE_ALLOCATION || (!set && x == "base:"))
                                || (!set && q.queries.is_empty());
                            if hit && set {
                                meta = Some(e.clone());
                            }
                            Ok(hit)
                        }
                    },
                };
                match reply {
                    Ok(hit) => {
                        if hit {
                            let id = if set { META_ID_ALLOCATION } else { 0 };
                            let mut d = id.to_be_bytes().to_vec();
                            d.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
                            w.write_all(&option_reply(opt, REP_META_CONTEXT, &d))
                                .await?;
                        }
                        w.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                    }
                    Err((kind, msg)) => {
                        w.write_all(&option_reply(opt, kind, msg.as_bytes()))
                            .await?;
                    }
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    w.write_all(&option_reply(
                        opt,
                        REP_ERR_INVALID,
                        b"STRUCTURED_REPLY takes no data",
                    ))
                    .await?;
                } else {
                    structured = true;
                    w.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                }
            }
            OPT_INFO | OPT_GO => {
                let Some(req) = parse_info_request(&data) else {
                    w.write_all(&option_reply(
                        opt,
                        REP_ERR_INVALID,
                        b"malformed INFO/GO request",
                    ))
                    .await?;
                    w.flush().await?;
                    continue;
                };
                let Some(e) = find(&req.name) else {
                    w.write_all(&option_reply(
                        opt,
                        REP_ERR_UNKNOWN,
                        format!("no export named '{}'", req.name).as_bytes(),
                    ))
                    .await?;
                    w.flush().await?;
                    continue;
                };
                let info = e.info();
                let mut d = INFO_EXPORT.to_be_bytes().to_vec();
                d.extend_from_slice(&info.size.to_be_bytes());
                d.extend_from_slice(
                    &transmission_flags(&info, structured || extended).to_be_bytes(),
                );
                w.write_all(&option_reply(opt, REP_INFO, &d)).await?;
                let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                d.extend_from_slice(&info.min_block.to_be_bytes());
                d.extend_from_slice(&info.preferred_block.to_be_bytes());
                d.extend_from_slice(&info.max_payload.to_be_bytes());
                w.write_all(&option_reply(opt, REP_INFO, &d)).await?;
                if req.requests.contains(&INFO_NAME) {
                    let name = exports
                        .iter()
                        .find(|(_, x)| Arc::ptr_eq(x, e))
                        .map(|(n, _)| n.clone())
                        .unwrap_or_default();
                    let mut d = INFO_NAME.to_be_bytes().to_vec();
                    d.extend_from_slice(name.as_bytes());
                    w.write_all(&option_reply(opt, REP_INFO, &d)).await?;
                }
                if let (true, Some(desc)) =
                    (req.requests.contains(&INFO_DESCRIPTION), &info.description)
                {
                    let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
                    d.extend_from_slice(desc.as_bytes());
                    w.write_all(&option_reply(opt, REP_INFO, &d)).await?;
                }
                w.write_all(&option_reply(opt, REP_ACK, &[])).await?;
                w.flush().await?;
                if opt == OPT_GO {
                    let sized = req.requests.contains(&INFO_BLOCK_SIZE);
                    let allocation = meta.as_ref().is_some_and(|m| Arc::ptr_eq(m, e));
                    return Ok(Some(Negotiated {
                        export: e.clone(),
                        info,
                        framing: Framing {
                            structured,
                            extended,
                        },
                        sized,
                        allocation,
                    }));
                }
            }
            OPT_STARTTLS if tls_done => {
                w.write_all(&option_reply(opt, REP_ERR_INVALID, b"TLS is already on"))
                    .await?;
            }
            OPT_STARTTLS => {
                w.write_all(&option_reply(
                    opt,
                    REP_ERR_POLICY,
                    b"TLS is not offered; use a Unix socket or a trusted network",
                ))
                .await?;
            }
            _ => {
                w.write_all(&option_reply(opt, REP_ERR_UNSUP, &[])).await?;
            }
        }
        w.flush().await?;
    }
}

/// Does a request carry a payload after its header? (Compact headers: a WRITE does;
/// extended: whoever sets NBD_CMD_FLAG_PAYLOAD_LEN, its length being the payload's.)
fn has_payload(req: &Request, framing: Framing) -> bool {
    match framing.extended {
        true => req.flags & CMD_FLAG_PAYLOAD_LEN != 0,
        false => req.kind == CMD_WRITE,
    }
}

/// Why a request is refused before it reaches the backend.
fn validate(req: &Request, neg: &Negotiated<impl Backend>) -> Result<(), (u32, &'static str)> {
    let info = &neg.info;
    let end = req.offset.checked_add(req.length);
    let beyond = end.is_none_or(|e| e > info.size);
    let ext = neg.framing.extended;
    let allowed_flags = match req.kind {
        CMD_READ => {
            if neg.framing.chunks() {
                CMD_FLAG_DF
            } else {
                0
            }
        }
        CMD_WRITE => CMD_FLAG_FUA | if ext { CMD_FLAG_PAYLOAD_LEN } else { 0 },
        CMD_FLUSH => 0,
        CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_CACHE => 0,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        _ => return Err((EINVAL, "unknown command")),
    };
    if req.flags & !allowed_flags != 0 {
        return Err((EINVAL, "flag not valid for this command"));
    }
    if ext && req.kind == CMD_WRITE && req.flags & CMD_FLAG_PAYLOAD_LEN == 0 {
        return Err((
            EINVAL,
            "a write with extended headers needs NBD_CMD_FLAG_PAYLOAD_LEN",
        ));
    }
    if req.flags & CMD_FLAG_FUA != 0 && !info.can_fua {
        return Err((EINVAL, "FUA not supported"));
    }
    match req.kind {
        CMD_READ => {
            if beyond {
                return Err((EINVAL, "read beyond the end of the export"));
            }
            if req.length > info.max_payload as u64 {
                return Err((EINVAL, "read larger than the maximum payload"));
            }
        }
        CMD_WRITE => {
            if info.read_only {
                return Err((EPERM, "export is read-only"));
            }
            if req.length > info.max_payload as u64 {
                return Err((EINVAL, "write larger than the maximum payload"));
            }
            if beyond {
                return Err((ENOSPC, "write beyond the end of the export"));
            }
        }
        CMD_FLUSH if !info.can_flush => {
            return Err((EINVAL, "flush not supported"));
        }
        CMD_TRIM => {
            if info.read_only {
                return Err((EPERM, "export is read-only"));
            }
            if !info.can_trim {
                return Err((EINVAL, "trim not supported"));
            }
            if beyond {
                return Err((EINVAL, "trim beyond the end of the export"));
            }
        }
        CMD_WRITE_ZEROES => {
            if info.read_only {
                return Err((EPERM, "export is read-only"));
            }
            if !info.can_write_zeroes {
                return Err((EINVAL, "write zeroes not supported"));
            }
            if beyond {
                return Err((ENOSPC, "write zeroes beyond the end of the export"));
            }
        }
        CMD_CACHE if beyond => {
            return Err((EINVAL, "cache beyond the end of the export"));
        }
        CMD_BLOCK_STATUS => {
            if !neg.allocation {
                return Err((
                    EINVAL,
                    "block status needs base:allocation selected (NBD_OPT_SET_META_CONTEXT)",
                ));
            }
            if req.length == 0 {
                return Err((EINVAL, "block status of no bytes"));
            }
            if beyond {
                return Err((EINVAL, "block status beyond the end of the export"));
            }
        }
        _ => {}
    }
    if !ext && req.kind != CMD_WRITE && req.flags & CMD_FLAG_PAYLOAD_LEN != 0 {
        return Err((EINVAL, "payload flag without extended headers"));
    }
    let aligned = |x: u64| x.is_multiple_of(info.min_block as u64);
    if neg.sized && req.kind != CMD_FLUSH && (!aligned(req.offset) || !aligned(req.length)) {
        return Err((EINVAL, "request not aligned to the minimum block size"));
    }
    Ok(())
}

async fn transmission<R, W, B>(
    mut r: BufReader<R>,
    w: BufWriter<W>,
    neg: Negotiated<B>,
    shared: Arc<Shared<B>>,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    B: Backend,
{
    let neg = Arc::new(neg);
    let stats = shared.stats.clone();
    let limits = &shared.limits;
    let (tx, rx) = mpsc::channel::<(Option<Reply<B::Buf>>, Option<Held>)>(1024);
    let framing = neg.framing;
    // The socket's write side: the reader task writes the replies of requests it answered
    // inline itself, when the writer is free (no hand-off to the writer task, which
    // measured as a third of the host idle under one connection's 4 KiB writes:
    // docs/PERFORMANCE.md); the writer task writes the rest.
    let sink = Arc::new(tokio::sync::Mutex::new(w));
    let writer = tokio::spawn(write_replies(sink.clone(), rx, framing, limits.io_timeout));
    // Replies of requests answered inline, not written yet: written before the reader
    // waits for anything (the client may wait for them before it sends more).
    let mut done: Vec<(Reply<B::Buf>, Held)> = Vec::new();
    macro_rules! answer {
        () => {
            if !done.is_empty() && !answer(&mut done, &sink, &tx, framing).await {
                break;
            }
        };
    }
    let budget = Arc::new(Semaphore::new(INFLIGHT_BUDGET as usize));
    let slots = Arc::new(Semaphore::new(INFLIGHT_REQUESTS));
    let most = (INFLIGHT_BUDGET as u64).min(limits.inflight_bytes) as u32;
    let queued_writes = neg.export.queued_writes();
    let mut result = Ok(());
    let late = |what: &str| {
        stats.timeouts.fetch_add(1, Relaxed);
        Err(timed_out(what))
    };
    loop {
        // Wait for the next request: for ever, or as long as the idle timeout allows while
        // nothing is in flight. The writer ending (the client not taking its replies)
        // ends the connection.
        // A whole request header buffered is read without waiting; with anything less,
        // the replies owed go out first, as they do when many wait (one write for them
        // all).
        if r.buffer().len() < EXTENDED_REQUEST_LEN || done.len() >= ANSWER_BATCH {
            answer!();
        }
        // The fast path: the next request is already buffered (no waiting, no timer).
        let waited = if !r.buffer().is_empty() {
            if *stop.borrow() || tx.is_closed() {
                break;
            }
            Some(Ok(false))
        } else {
            loop {
                let idle = async {
                    match limits.idle_timeout {
                        Some(t) => tokio::time::sleep(t).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    _ = stop.changed() => break None,
                    _ = tx.closed() => break None,
                    x = r.fill_buf() => break Some(x.map(|b| b.is_empty())),
                    _ = idle => if slots.available_permits() == INFLIGHT_REQUESTS {
                        stats.timeouts.fetch_add(1, Relaxed);
                        tracing::debug!("closing an idle connection");
                        break None;
                    },
                }
            }
        };
        match waited {
            None | Some(Ok(true)) => break,
            Some(Err(e)) => {
                result = Err(e);
                break;
            }
            Some(Ok(false)) => {}
        }
        // A request has begun: the rest of its header is due now.
        let mut hdr = [0u8; EXTENDED_REQUEST_LEN];
        let hdr_len = match framing.extended {
            true => EXTENDED_REQUEST_LEN,
            false => REQUEST_LEN,
        };
        match read_within(&mut r, &mut hdr[..hdr_len], limits.io_timeout).await {
            Err(_) => {
                result = late("a request header did not arrive in time");
                break;
            }
            Ok(Err(e)) => {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    result = Err(e);
                }
                break;
            }
            Ok(Ok(_)) => {}
        }
        let parsed = match framing.extended {
            true => parse_extended_request(&hdr),
            false => parse_request(hdr[..REQUEST_LEN].try_into().expect("28 bytes")),
        };
        let Some(req) = parsed else {
            stats.protocol_errors.fetch_add(1, Relaxed);
            result = Err(proto_err("bad request magic"));
            break;
        };
        stats.requests.fetch_add(1, Relaxed);
        if req.kind == CMD_DISC {
            break;
        }
        let verdict = validate(&req, &neg);
        let payload_follows = has_payload(&req, framing);
        if payload_follows && req.length > DRAIN_LIMIT as u64 {
            stats.protocol_errors.fetch_add(1, Relaxed);
            result = Err(proto_err(format!(
                "request payload of {} bytes",
                req.length
            )));
            break;
        }
        if let Err((error, msg)) = verdict {
            answer!();
            // A payload follows its header whatever we think of the request: consumed
            // without being kept.
            if payload_follows {
                let (mut from, mut to) = ((&mut r).take(req.length), tokio::io::sink());
                match timeout(limits.io_timeout, tokio::io::copy(&mut from, &mut to)).await {
                    Err(_) => {
                        result = late("a write payload did not arrive in time");
                        break;
                    }
                    Ok(Err(e)) => {
                        result = Err(e);
                        break;
                    }
                    Ok(Ok(_)) => {}
                }
            }
            stats.errors.fetch_add(1, Relaxed);
            let reply = Reply::Err {
                cookie: req.cookie,
                offset: req.offset,
                error,
                chunk: matches!(req.kind, CMD_READ | CMD_BLOCK_STATUS),
                msg,
            };
            if tx.send((Some(reply), None)).await.is_err() {
                break;
            }
            continue;
        }
        // Counted from here (its header) to its reply, when the backend keeps the count.
        let queued = match (&queued_writes, req.kind) {
            (Some(q), CMD_WRITE) => Some(Queued::new(q)),
            _ => None,
        };
        // Budget first, then the buffer: no payload is allocated beyond the budget. The
        // cost never exceeds the budget (it is at least the export's max payload).
        let cost = match req.kind {
            CMD_READ | CMD_WRITE => (req.length as u32).max(1),
            _ => 1,
        }
        .min(most);
        // The fast path first: budget to spare takes no waiting (so no wait for a stop
        // either: a `changed()` future per request measured as a few percent of the
        // server's CPU on 4 KiB writes).
        let fast = match (
            budget.clone().try_acquire_many_owned(cost),
            shared.budget.clone().try_acquire_many_owned(cost),
        ) {
            (Ok(c), Ok(a)) => Some((c, a)),
            _ => None,
        };
        if fast.is_none() {
            // Replies owed hold budget of their own.
            answer!();
        }
        let (c, a) = match fast {
            Some(x) => x,
            None => tokio::select! {
                biased;
                _ = stop.changed() => break,
                h = async {
                    let c = budget.clone().acquire_many_owned(cost).await;
                    let a = shared.budget.clone().acquire_many_owned(cost).await;
                    (c, a)
                } => {
                    let (Ok(c), Ok(a)) = h else { break };
                    (c, a)
                }
            },
        };
        stats.inflight_bytes.fetch_add(cost as u64, Relaxed);
        let held = Held {
            _conn: c,
            _all: a,
            stats: stats.clone(),
            bytes: cost as u64,
        };
        let mut payload = None;
        if req.kind == CMD_WRITE {
            let mut buf = neg.export.alloc(req.length as usize);
            let got = if r.buffer().len() >= buf.as_ref().len() {
                // Already here: nothing to wait for.
                Ok(r.read_exact(buf.as_mut()).await)
            } else {
                answer!();
                tokio::select! {
                    biased;
                    _ = stop.changed() => break,
                    x = read_within(&mut r, buf.as_mut(), limits.io_timeout) => x,
                }
            };
            match got {
                Err(_) => {
                    result = late("a write payload did not arrive in time");
                    break;
                }
                Ok(Err(e)) => {
                    result = Err(e);
                    break;
                }
                Ok(Ok(_)) => {}
            }
            payload = Some(buf);
        }
        let slot = match slots.clone().try_acquire_owned() {
            Ok(s) => s,
            Err(_) => {
                answer!();
                slots.clone().acquire_owned().await.expect("semaphore open")
            }
        };
        let (neg2, stats2) = (neg.clone(), stats.clone());
        let mut work = Box::pin(async move {
            let reply = execute(&neg2, req, payload, &stats2).await;
            drop(queued);
            // The budget goes with the reply: a READ's data is held until it is sent.
            (reply, held, slot)
        });
        // Poll a small request once here: one that completes without waiting (a member
        // in memory, an error) is answered without a task of its own, which measured as one
        // scheduling hand-off too many per 4 KiB request (docs/PERFORMANCE.md). Anything
        // that waits goes on in its own task, so a slow request never holds up the next
        // ones; large transfers always get their own task, so their copying can run on
        // another core while this one reads the next request.
        let ready = match cost <= INLINE_POLL_MAX {
            true => poll_once(&mut work).await,
            false => None,
        };
        match ready {
            Some((reply, held, slot)) => {
                drop(slot);
                done.push((reply, held));
            }
            None => {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let (reply, held, slot) = work.await;
                    let _ = tx.send((Some(reply), Some(held))).await;
                    drop(slot);
                });
            }
        }
    }
    // The replies owed, then let in-flight requests finish, then close the writer.
    if !done.is_empty() {
        answer(&mut done, &sink, &tx, framing).await;
    }
    let _ = slots.acquire_many(INFLIGHT_REQUESTS as u32).await;
    drop(tx);
    match writer.await {
        Ok(Err(e)) if result.is_ok() => {
            if e.kind() == io::ErrorKind::TimedOut {
                stats.timeouts.fetch_add(1, Relaxed);
            }
            result = Err(e)
        }
        _ => {}
    }
    result
}

/// `read_exact` within `t`; without a timer when the bytes are already buffered (the
/// common case for a small request: its header and payload came in one read).
async fn read_within<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    buf: &mut [u8],
    t: Duration,
) -> Result<io::Result<usize>, tokio::time::error::Elapsed> {
    if r.buffer().len() >= buf.len() {
        return Ok(r.read_exact(buf).await);
    }
    timeout(t, r.read_exact(buf)).await
}

fn err_code(e: NbdError) -> u32 {
    e.code()
}

/// The largest piece of a TRIM or WRITE_ZEROES with a 64-bit length (extended headers)
/// handed to the backend at once: a multiple of every block size.
const EFFECT_PIECE: u64 = 1 << 31;

/// Run `f` over `[offset, offset + len)` in pieces of at most [`EFFECT_PIECE`] bytes.
async fn in_pieces<F, Fut>(offset: u64, len: u64, mut f: F) -> Result<(), NbdError>
where
    F: FnMut(u64, u32) -> Fut,
    Fut: Future<Output = Result<(), NbdError>>,
{
    let mut at = 0;
    while at < len {
        let n = (len - at).min(EFFECT_PIECE);
        f(offset + at, n as u32).await?;
        at += n;
    }
    Ok(())
}

/// Turn a backend's block status into the reply's descriptors: from `offset`, within the
/// request, each a multiple of the block size where the request is, at most one with
/// REQ_ONE, 32-bit lengths without extended headers, and never none.
fn descriptors(
    req: &Request,
    extents: &[crate::backend::Extent],
    bs: u64,
    ext: bool,
) -> Vec<(u64, u32)> {
    let most = if ext {
        u64::MAX
    } else {
        u32::MAX as u64 / bs * bs
    };
    let mut left = req.length;
    let mut out: Vec<(u64, u32)> = Vec::new();
    for x in extents {
        if left == 0 {
            break;
        }
        let n = x.length.min(left);
        if n == 0 {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 == x.flags && last.0 + n <= most => last.0 += n,
            _ => out.push((n, x.flags)),
        }
        left -= n;
    }
    if out.is_empty() {
        out.push((req.length, 0));
    }
    let one = req.flags & CMD_FLAG_REQ_ONE != 0;
    if one {
        out.truncate(1);
    }
    // Lengths that do not fit 32 bits: the first descriptor cut to fit, and the answer
    // ends there (the client asks again from where it stops).
    if let Some(i) = out.iter().position(|d| d.0 > most) {
        out.truncate(i + 1);
        out[i].0 = most.max(bs.min(out[i].0));
    }
    out
}

/// A WRITE counted in the backend's [`Backend::queued_writes`] while alive.
struct Queued(Arc<std::sync::atomic::AtomicUsize>);

impl Queued {
    fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> Queued {
        count.fetch_add(1, Relaxed);
        Queued(count.clone())
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

async fn execute<B: Backend>(
    neg: &Negotiated<B>,
    req: Request,
    payload: Option<B::Buf>,
    stats: &Stats,
) -> Reply<B::Buf> {
    let e = &neg.export;
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let bs = neg.info.min_block as u64;
    let aligned = req.offset.is_multiple_of(bs) && req.length.is_multiple_of(bs);
    let cookie = req.cookie;
    let offset = req.offset;
    let done = |r: Result<(), NbdError>| match r {
        Ok(()) => Reply::Simple {
            cookie,
            offset,
            error: 0,
        },
        Err(err) => {
            stats.errors.fetch_add(1, Relaxed);
            Reply::Err {
                cookie,
                offset,
                error: err_code(err),
                chunk: false,
                msg: "request failed",
            }
        }
    };
    match req.kind {
        CMD_READ => {
            stats.read_bytes.fetch_add(req.length, Relaxed);
            let len = req.length as u32; // validated: at most the max payload
            let r = if aligned || len == 0 {
                if len == 0 {
                    Ok(e.alloc(0))
                } else {
                    e.read(req.offset, len).await
                }
            } else {
                read_unaligned(e.as_ref(), req.offset, len, bs).await
            };
            match r {
                Ok(data) => Reply::Data {
                    cookie,
                    offset: req.offset,
                    data,
                },
                Err(err) => {
                    stats.errors.fetch_add(1, Relaxed);
                    Reply::Err {
                        cookie,
                        offset,
                        error: err_code(err),
                        chunk: true,
                        msg: "read failed",
                    }
                }
            }
        }
        CMD_WRITE => {
            stats.write_bytes.fetch_add(req.length, Relaxed);
            let data = payload.expect("write payload read");
            if req.length == 0 {
                return done(Ok(()));
            }
            if aligned {
                done(e.write(req.offset, data, fua).await)
            } else {
                // The backend merges partial blocks under its own per-block locking, the
                // same for every connection (see Backend::write_unaligned).
                done(e.write_unaligned(req.offset, data, fua).await)
            }
        }
        CMD_FLUSH => done(e.flush().await),
        CMD_TRIM => {
            // Advisory: trim only the whole blocks inside the range.
            let start = req.offset.div_ceil(bs) * bs;
            let end = (req.offset + req.length) / bs * bs;
            if end > start {
                done(in_pieces(start, end - start, |o, n| e.trim(o, n, fua)).await)
            } else {
                done(Ok(()))
            }
        }
        CMD_WRITE_ZEROES => {
            let no_hole = req.flags & CMD_FLAG_NO_HOLE != 0;
            if req.flags & CMD_FLAG_FAST_ZERO != 0 && !e.fast_zero(req.offset, req.length) {
                // Fails at once, before anything is written: the client writes instead.
                return Reply::Err {
                    cookie,
                    offset,
                    error: ENOTSUP,
                    chunk: false,
                    msg: "zeroing this range is no faster than writing it",
                };
            }
            if req.length == 0 {
                return done(Ok(()));
            }
            if aligned {
                done(
                    in_pieces(req.offset, req.length, |o, n| {
                        e.write_zeroes(o, n, fua, no_hole)
                    })
                    .await,
                )
            } else {
                // Unaligned: the whole blocks inside go the plain way, the ends merged.
                let (a0, a1) = (
                    req.offset.div_ceil(bs) * bs,
                    (req.offset + req.length) / bs * bs,
                );
                let r = async {
                    if a1 <= a0 || req.length <= EFFECT_PIECE {
                        return e
                            .write_zeroes_unaligned(req.offset, req.length as u32, fua, no_hole)
                            .await;
                    }
                    if req.offset < a0 {
                        e.write_zeroes_unaligned(
                            req.offset,
                            (a0 - req.offset) as u32,
                            fua,
                            no_hole,
                        )
                        .await?;
                    }
                    in_pieces(a0, a1 - a0, |o, n| e.write_zeroes(o, n, fua, no_hole)).await?;
                    let end = req.offset + req.length;
                    if a1 < end {
                        e.write_zeroes_unaligned(a1, (end - a1) as u32, fua, no_hole)
                            .await?;
                    }
                    Ok(())
                };
                done(r.await)
            }
        }
        CMD_CACHE => done(e.cache(req.offset, req.length).await),
        CMD_BLOCK_STATUS => match e.block_status(req.offset, req.length).await {
            Ok(x) => Reply::Status {
                cookie,
                offset,
                extents: descriptors(&req, &x, bs, neg.framing.extended),
            },
            Err(err) => {
                stats.errors.fetch_add(1, Relaxed);
                Reply::Err {
                    cookie,
                    offset,
                    error: err_code(err),
                    chunk: true,
                    msg: "block status failed",
                }
            }
        },
        _ => unreachable!("validated"),
    }
}

async fn read_unaligned<B: Backend>(
    e: &B,
    offset: u64,
    len: u32,
    bs: u64,
) -> Result<B::Buf, NbdError> {
    let start = offset / bs * bs;
    let end = (offset + len as u64).div_ceil(bs) * bs;
    let whole = e.read(start, (end - start) as u32).await?;
    let mut out = e.alloc(len as usize);
    let from = (offset - start) as usize;
    out.as_mut()
        .copy_from_slice(&whole.as_ref()[from..from + len as usize]);
    Ok(out)
}

/// Poll `f` once: its output if it completes without waiting, `None` if it would wait
/// (it is left to be polled again, or dropped).
async fn poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut *f).poll(cx) {
            std::task::Poll::Ready(x) => Some(x),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

/// Write the replies of requests answered inline (`done`) on the socket, if the writer task
/// is not writing (else they go to it through `tx`): those that fit in the write buffer
/// are copied there, then one flush is tried; what it leaves, and what did not fit, the
/// writer task sends (under its deadline). False when the writer task has ended (the
/// connection is over).
async fn answer<W, Buf, H>(
    done: &mut Vec<(Reply<Buf>, H)>,
    sink: &tokio::sync::Mutex<BufWriter<W>>,
    tx: &mpsc::Sender<(Option<Reply<Buf>>, Option<H>)>,
    framing: Framing,
) -> bool
where
    W: AsyncWrite + Unpin,
    Buf: AsRef<[u8]>,
{
    let mut rest = Vec::new();
    let mut nudge = false;
    if let Ok(mut w) = sink.try_lock() {
        for (reply, held) in done.drain(..) {
            match wire_len(&reply) {
                Some(n) if w.buffer().len() + n <= IO_BUF => {
                    // It fits: copied into the buffer, never waiting (a reply cut short
                    // by a wait would break the stream, so it is driven to its end).
                    let mut f = std::pin::pin!(write_reply(&mut w, reply, framing));
                    let r = match poll_once(&mut f).await {
                        Some(r) => r,
                        None => f.await,
                    };
                    drop(held);
                    if r.is_err() {
                        nudge = true;
                    }
                }
                _ => rest.push((reply, held)),
            }
        }
        // Left in the buffer, or the socket failed: the writer task finishes the flush
        // under its deadline, or meets the error and ends the connection.
        let mut f = std::pin::pin!(w.flush());
        nudge |= !matches!(poll_once(&mut f).await, Some(Ok(())));
    } else {
        rest.append(done);
    }
    if nudge && tx.send((None, None)).await.is_err() {
        return false;
    }
    for (reply, held) in rest {
        if tx.send((Some(reply), Some(held))).await.is_err() {
            return false;
        }
    }
    true
}

/// The most bytes a reply takes on the wire; `None` for one of no fixed bound (a
/// BLOCK_STATUS answer).
fn wire_len<Buf: AsRef<[u8]>>(reply: &Reply<Buf>) -> Option<usize> {
    match reply {
        Reply::Simple { .. } => Some(32),
        Reply::Data { data, .. } => Some(40 + data.as_ref().len()),
        Reply::Err { msg, .. } => Some(64 + msg.len()),
        Reply::Status { .. } => None,
    }
}

/// Write replies as they come, coalescing those ready together; each reply's budget is
/// returned once it is written. A client that does not take a batch of replies within
/// `io_timeout` loses its connection.
async fn write_replies<W, Buf, H>(
    sink: Arc<tokio::sync::Mutex<BufWriter<W>>>,
    mut rx: mpsc::Receiver<(Option<Reply<Buf>>, Option<H>)>,
    framing: Framing,
    io_timeout: Duration,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
    Buf: AsRef<[u8]>,
{
    while let Some(first) = rx.recv().await {
        let mut w = sink.lock().await;
        let batch = async {
            let mut next = Some(first);
            while let Some((reply, held)) = next.take() {
                if let Some(reply) = reply {
                    write_reply(&mut w, reply, framing).await?;
                }
                drop(held);
                next = rx.try_recv().ok();
            }
            w.flush().await
        };
        // A batch the socket takes at once needs no timer (arming and disarming one per
        // batch showed in the profile of 4 KiB writes); one that waits gets its deadline.
        let mut batch = std::pin::pin!(batch);
        match poll_once(&mut batch).await {
            Some(r) => r?,
            None => timeout(io_timeout, batch)
                .await
                .map_err(|_| timed_out("the client did not take its replies in time"))??,
        }
    }
    let mut w = sink.lock().await;
    w.flush().await?;
    let _ = w.shutdown().await;
    Ok(())
}

async fn write_reply<W, Buf>(
    w: &mut BufWriter<W>,
    reply: Reply<Buf>,
    framing: Framing,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
    Buf: AsRef<[u8]>,
{
    let ext = framing.extended;
    match reply {
        Reply::Simple {
            cookie,
            offset,
            error,
        } => {
            if !ext {
                return w.write_all(&simple_reply_header(error, cookie)).await;
            }
            if error == 0 {
                let h = extended_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, offset, 0);
                w.write_all(&h).await
            } else {
                w.write_all(&extended_error_chunk(cookie, offset, error, ""))
                    .await
            }
        }
        Reply::Data {
            cookie,
            offset,
            data,
        } => {
            let d = data.as_ref();
            if ext {
                let mut h = [0u8; 40];
                h[..32].copy_from_slice(&extended_header(
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_OFFSET_DATA,
                    cookie,
                    offset,
                    8 + d.len() as u64,
                ));
                h[32..].copy_from_slice(&offset.to_be_bytes());
                w.write_all(&h).await?;
            } else if framing.structured {
                let mut h = [0u8; 28];
                h[..20].copy_from_slice(&chunk_header(
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_OFFSET_DATA,
                    cookie,
                    8 + d.len() as u32,
                ));
                h[20..].copy_from_slice(&offset.to_be_bytes());
                w.write_all(&h).await?;
            } else {
                w.write_all(&simple_reply_header(0, cookie)).await?;
            }
            w.write_all(d).await
        }
        Reply::Status {
            cookie,
            offset,
            extents,
        } => {
            let mut v;
            if ext {
                let len = 8 + 16 * extents.len() as u64;
                v = Vec::with_capacity(32 + len as usize);
                v.extend_from_slice(&extended_header(
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_BLOCK_STATUS_EXT,
                    cookie,
                    offset,
                    len,
                ));
                v.extend_from_slice(&META_ID_ALLOCATION.to_be_bytes());
                v.extend_from_slice(&(extents.len() as u32).to_be_bytes());
                for (n, flags) in &extents {
                    v.extend_from_slice(&n.to_be_bytes());
                    v.extend_from_slice(&(*flags as u64).to_be_bytes());
                }
            } else {
                let len = 4 + 8 * extents.len() as u32;
                v = Vec::with_capacity(20 + len as usize);
                v.extend_from_slice(&chunk_header(
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_BLOCK_STATUS,
                    cookie,
                    len,
                ));
                v.extend_from_slice(&META_ID_ALLOCATION.to_be_bytes());
                for (n, flags) in &extents {
                    v.extend_from_slice(&(*n as u32).to_be_bytes());
                    v.extend_from_slice(&flags.to_be_bytes());
                }
            }
            w.write_all(&v).await
        }
        Reply::Err {
            cookie,
            offset,
            error,
            chunk,
            msg,
        } => {
            if ext {
                w.write_all(&extended_error_chunk(cookie, offset, error, msg))
                    .await
            } else if framing.structured && chunk {
                w.write_all(&error_chunk(cookie, error, msg)).await
            } else {
                w.write_all(&simple_reply_header(error, cookie)).await
            }
        }
    }
}
