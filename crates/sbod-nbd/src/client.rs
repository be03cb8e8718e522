//! An NBD client: one connection to one export, many requests in flight, replies in any
//! order (simple or structured), for sbod's remote members.
//!
//! Written here rather than bound from libnbd: libnbd's Rust bindings need libnbd-dev and a
//! C toolchain at build time and drive their own event loop through callbacks, while sbod
//! already owns the protocol's wire format (proto.rs, fuzzed on the server side) and needs
//! exactly the policy a RAID head wants around it: requests handed back (with their buffers)
//! when a connection dies so they can be retried on the next one, a timeout that declares a
//! silent server dead, and a reply parser that refuses anything that does not account for
//! every byte of a read exactly once, so a broken or hostile server can fail the member but
//! never hand the engine bytes it did not mean.
//!
//! One task writes requests (coalescing small ones), one reads replies; a watchdog closes
//! the connection if the oldest request waits longer than the I/O timeout.

use crate::backend::ExportInfo;
use crate::proto::*;
use crate::uri::{NbdUri, Transport};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, oneshot, watch};

/// A buffer the client reads into or writes from, owned by the request while it runs.
pub trait ClientBuf: Send + Sync + 'static {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl ClientBuf for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// One NBD command. Buffers travel with it and come back in the [`Outcome`].
#[derive(Debug)]
pub enum Command<B> {
    /// Fill `buf` from `offset`.
    Read {
        offset: u64,
        buf: B,
    },
    Write {
        offset: u64,
        buf: B,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    },
}

impl<B: ClientBuf> Command<B> {
    fn header(&self, cookie: u64, df: bool) -> Request {
        let (kind, flags, offset, length) = match self {
            Command::Read { offset, buf } => (
                CMD_READ,
                if df { CMD_FLAG_DF } else { 0 },
                *offset,
                buf.bytes().len() as u32,
            ),
            Command::Write { offset, buf, fua } => (
                CMD_WRITE,
                if *fua { CMD_FLAG_FUA } else { 0 },
                *offset,
                buf.bytes().len() as u32,
            ),
            Command::Flush => (CMD_FLUSH, 0, 0, 0),
            Command::Trim { offset, len } => (CMD_TRIM, 0, *offset, *len),
            Command::WriteZeroes {
                offset,
                len,
                fua,
                no_hole,
            } => (
                CMD_WRITE_ZEROES,
                (if *fua { CMD_FLAG_FUA } else { 0 })
                    | (if *no_hole { CMD_FLAG_NO_HOLE } else { 0 }),
                *offset,
                *len,
            ),
        };
        Request {
            flags,
            kind,
            cookie,
            offset,
            length: length as u64,
        }
    }
}

/// How a request ended.
#[derive(Debug)]
pub enum Outcome<B> {
    /// The server did it (a read's buffer holds the bytes).
    Done(Command<B>),
    /// The server refused or failed it (errno from the reply).
    Failed(Command<B>, io::Error),
    /// The connection ended before the reply: the request may or may not have reached
    /// the disk, and may be sent again on another connection.
    Lost(Command<B>),
}

/// Why a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Death {
    /// The network or the server went away (EOF, reset, a failed write).
    Io(String),
    /// A request waited longer than the I/O timeout.
    Timeout(Duration),
    /// The server broke the protocol: it is not to be trusted until it is restarted.
    Protocol(String),
    /// We closed it.
    Closed,
}

impl std::fmt::Display for Death {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Death::Io(e) => write!(f, "connection lost: {e}"),
            Death::Timeout(d) => write!(f, "no reply within {} ms", d.as_millis()),
            Death::Protocol(e) => write!(f, "protocol violation: {e}"),
            Death::Closed => write!(f, "closed"),
        }
    }
}

/// Ask an NBD server for an export's description (NBD_OPT_INFO with
/// NBD_INFO_DESCRIPTION), blocking, within `limit` for every step; the connection ends
/// with NBD_OPT_ABORT. For `sbod health` on remote members (the exporting host puts its
/// disk's health there), called from a plain thread: std sockets, no runtime. `Ok(None)`:
/// the server gave no description. Over TLS (`nbds://`): an error, not read.
pub fn describe_blocking(uri: &NbdUri, limit: std::time::Duration) -> io::Result<Option<String>> {
    use std::io::{Read, Write};
    if uri.tls {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the export needs TLS; its description is not read",
        ));
    }
    fn talk<S: Read + Write>(s: &mut S, export: &str) -> io::Result<Option<String>> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello)?;
        if hello[..8] != NBDMAGIC.to_be_bytes() || hello[8..16] != IHAVEOPT.to_be_bytes() {
            return Err(bad("not a newstyle NBD server"));
        }
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())?;
        let info = encode_info_request(&InfoRequest {
            name: export.to_string(),
            requests: vec![INFO_DESCRIPTION],
        });
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&OPT_INFO.to_be_bytes());
        v.extend_from_slice(&(info.len() as u32).to_be_bytes());
        v.extend_from_slice(&info);
        s.write_all(&v)?;
        let mut desc = None;
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h)?;
            let kind = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
            let len = u32::from_be_bytes(h[16..20].try_into().expect("4 bytes"));
            if u64::from_be_bytes(h[..8].try_into().expect("8 bytes")) != OPT_REPLY_MAGIC
                || len > MAX_OPTION_LEN
            {
                return Err(bad("malformed option reply"));
            }
            let mut d = vec![0u8; len as usize];
            s.read_exact(&mut d)?;
            match kind {
                REP_INFO if d.len() >= 2 && d[..2] == INFO_DESCRIPTION.to_be_bytes() => {
                    desc = Some(String::from_utf8_lossy(&d[2..]).into_owned());
                }
                REP_INFO => {}
                REP_ACK => break,
                k => {
                    return Err(bad(&format!(
                        "the server refused INFO ({})",
                        option_error(k, &d)
                    )))
                }
            }
        }
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&OPT_ABORT.to_be_bytes());
        v.extend_from_slice(&0u32.to_be_bytes());
        let _ = s.write_all(&v);
        Ok(desc)
    }
    match &uri.transport {
        Transport::Unix { socket } => {
            let mut s = std::os::unix::net::UnixStream::connect(socket)?;
            s.set_read_timeout(Some(limit))?;
            s.set_write_timeout(Some(limit))?;
            talk(&mut s, &uri.export)
        }
        Transport::Tcp { host, port } => {
            use std::net::ToSocketAddrs;
            let addr = (host.as_str(), *port)
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
            let mut s = std::net::TcpStream::connect_timeout(&addr, limit)?;
            s.set_read_timeout(Some(limit))?;
            s.set_write_timeout(Some(limit))?;
            talk(&mut s, &uri.export)
        }
    }
}

/// What the client is told at connection time, and how it behaves.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Connect and handshake within this time.
    pub connect_timeout: Duration,
    /// A request with no reply for this long means the server or the path is dead.
    pub io_timeout: Duration,
    /// TLS configuration for `nbds://` (built from the URI when `None`).
    pub tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(10),
            io_timeout: Duration::from_secs(30),
            tls: None,
        }
    }
}

pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
type BoxStream = Box<dyn Stream>;

struct Pending<B> {
    cmd: Command<B>,
    reply: oneshot::Sender<Outcome<B>>,
}

/// A request the server has (or is being sent).
struct InFlight<B> {
    /// `None` while the writer still sends a WRITE's payload.
    cmd: Option<Command<B>>,
    reply: oneshot::Sender<Outcome<B>>,
    sent: Instant,
    /// A reply that came before the writer finished (servers may answer early).
    early: Option<Result<(), io::Error>>,
}

struct Shared<B> {
    inflight: Mutex<HashMap<u64, InFlight<B>>>,
    death: Mutex<Option<Death>>,
    dead_tx: watch::Sender<bool>,
    next_cookie: AtomicU64,
    queued: AtomicU64,
}

impl<B> Shared<B> {
    fn die(&self, why: Death) {
        let mut d = self.death.lock();
        if d.is_none() {
            *d = Some(why);
        }
        drop(d);
        let _ = self.dead_tx.send(true);
    }
}

/// One connection to an export.
pub struct Connection<B: ClientBuf> {
    tx: mpsc::UnboundedSender<Pending<B>>,
    shared: Arc<Shared<B>>,
    dead_rx: watch::Receiver<bool>,
    info: ExportInfo,
    df: bool,
}

fn proto(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// The errno in a reply as an I/O error.
fn errno(e: u32) -> io::Error {
    let code = match e {
        EPERM | EIO | ENOMEM | EINVAL | ENOSPC | EOVERFLOW | ENOTSUP | ESHUTDOWN => e as i32,
        _ => EIO as i32,
    };
    io::Error::from_raw_os_error(code)
}

/// Build the TLS configuration an `nbds://` URI asks for.
pub fn tls_config(uri: &NbdUri) -> io::Result<Arc<tokio_rustls::rustls::ClientConfig>> {
    crate::tls::client_config(uri)
}

async fn open_stream(uri: &NbdUri) -> io::Result<BoxStream> {
    Ok(match &uri.transport {
        Transport::Tcp { host, port } => {
            let s = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("connecting to {host}:{port}: {e}"))
                })?;
            let _ = s.set_nodelay(true);
            Box::new(s)
        }
        Transport::Unix { socket } => {
            let s = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
                io::Error::new(e.kind(), format!("connecting to {}: {e}", socket.display()))
            })?;
            Box::new(s)
        }
    })
}

async fn read_option_reply(s: &mut BoxStream, opt: u32) -> io::Result<(u32, Vec<u8>)> {
    let magic = s.read_u64().await?;
    if magic != OPT_REPLY_MAGIC {
        return Err(proto(format!("bad option reply magic {magic:#x}")));
    }
    let o = s.read_u32().await?;
    if o != opt {
        return Err(proto(format!("reply to option {o}, expected {opt}")));
    }
    let kind = s.read_u32().await?;
    let len = s.read_u32().await?;
    if len > MAX_OPTION_LEN {
        return Err(proto(format!("option reply of {len} bytes")));
    }
    let mut data = vec![0u8; len as usize];
    s.read_exact(&mut data).await?;
    Ok((kind, data))
}

async fn send_option(s: &mut BoxStream, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut v = Vec::with_capacity(16 + data.len());
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    s.write_all(&v).await?;
    s.flush().await
}

fn option_error(kind: u32, data: &[u8]) -> String {
    let msg = String::from_utf8_lossy(data);
    let what = match kind {
        REP_ERR_UNSUP => "not supported",
        REP_ERR_POLICY => "refused by policy",
        REP_ERR_INVALID => "invalid",
        REP_ERR_UNKNOWN => "unknown export",
        REP_ERR_SHUTDOWN => "server shutting down",
        REP_ERR_TOO_BIG => "too big",
        _ => "error",
    };
    if msg.is_empty() {
        what.to_string()
    } else {
        format!("{what}: {msg}")
    }
}

fn flags_info(size: u64, tflags: u16, info: &mut ExportInfo) {
    info.size = size;
    info.read_only = tflags & TF_READ_ONLY != 0;
    info.can_flush = tflags & TF_SEND_FLUSH != 0;
    info.can_fua = tflags & TF_SEND_FUA != 0;
    info.can_trim = tflags & TF_SEND_TRIM != 0;
    info.can_write_zeroes = tflags & TF_SEND_WRITE_ZEROES != 0;
    info.can_multi_conn = tflags & TF_CAN_MULTI_CONN != 0;
}

/// The fixed newstyle handshake, STARTTLS for `nbds`, structured replies, and GO with
/// block sizes (EXPORT_NAME for old servers). Returns the stream in transmission phase.
async fn handshake(
    mut s: BoxStream,
    uri: &NbdUri,
    opts: &ClientOptions,
) -> io::Result<(BoxStream, ExportInfo, bool, bool)> {
    let magic = s.read_u64().await?;
    if magic != NBDMAGIC {
        return Err(proto(format!("not an NBD server (magic {magic:#x})")));
    }
    let m2 = s.read_u64().await?;
    if m2 != IHAVEOPT {
        return Err(proto(
            "the server speaks the old NBD handshake, which names no exports; use a newstyle server",
        ));
    }
    let hflags = s.read_u16().await?;
    if hflags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(proto("the server does not speak fixed newstyle NBD"));
    }
    let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
    let mut cflags = FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        cflags |= FLAG_C_NO_ZEROES;
    }
    s.write_all(&cflags.to_be_bytes()).await?;
    if uri.tls {
        send_option(&mut s, OPT_STARTTLS, &[]).await?;
        let (kind, data) = read_option_reply(&mut s, OPT_STARTTLS).await?;
        if kind != REP_ACK {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "the server does not offer TLS ({}); use nbd:// for a plain connection",
                    option_error(kind, &data)
                ),
            ));
        }
        let cfg = match &opts.tls {
            Some(c) => c.clone(),
            None => tls_config(uri)?,
        };
        s = crate::tls::connect(s, uri, cfg).await?;
    }
    send_option(&mut s, OPT_STRUCTURED_REPLY, &[]).await?;
    let (kind, _) = read_option_reply(&mut s, OPT_STRUCTURED_REPLY).await?;
    let structured = kind == REP_ACK;
    let mut info = ExportInfo {
        size: 0,
        min_block: 1,
        preferred_block: 4096,
        max_payload: 32 << 20,
        read_only: false,
        can_flush: false,
        can_fua: false,
        can_trim: false,
        can_write_zeroes: false,
        can_multi_conn: false,
        description: None,
    };
    let mut tflags = 0u16;
    let go = encode_info_request(&InfoRequest {
        name: uri.export.clone(),
        requests: vec![INFO_BLOCK_SIZE],
    });
    send_option(&mut s, OPT_GO, &go).await?;
    let mut got_export = false;
    loop {
        let (kind, data) = read_option_reply(&mut s, OPT_GO).await?;
        match kind {
            REP_INFO => {
                if data.len() < 2 {
                    return Err(proto("short INFO reply"));
                }
                let ty = u16::from_be_bytes([data[0], data[1]]);
                let d = &data[2..];
                match ty {
                    INFO_EXPORT if d.len() == 10 => {
                        let size = u64::from_be_bytes(d[0..8].try_into().expect("8 bytes"));
                        tflags = u16::from_be_bytes([d[8], d[9]]);
                        flags_info(size, tflags, &mut info);
                        got_export = true;
                    }
                    INFO_BLOCK_SIZE if d.len() == 12 => {
                        info.min_block = u32::from_be_bytes(d[0..4].try_into().expect("4"));
                        info.preferred_block = u32::from_be_bytes(d[4..8].try_into().expect("4"));
                        info.max_payload = u32::from_be_bytes(d[8..12].try_into().expect("4"));
                    }
                    INFO_EXPORT | INFO_BLOCK_SIZE => {
                        return Err(proto(format!("INFO type {ty} of {} bytes", d.len())))
                    }
                    _ => {}
                }
            }
            REP_ACK => break,
            REP_ERR_UNSUP => {
                // An old server: NBD_OPT_EXPORT_NAME has no way to report errors but closing.
                send_option(&mut s, OPT_EXPORT_NAME, uri.export.as_bytes()).await?;
                let size = s.read_u64().await.map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "the server closed on export '{}' (no such export?)",
                            uri.export
                        ),
                    )
                })?;
                tflags = s.read_u16().await?;
                if !no_zeroes {
                    let mut z = [0u8; 124];
                    s.read_exact(&mut z).await?;
                }
                flags_info(size, tflags, &mut info);
                got_export = true;
                break;
            }
            k if k & (1 << 31) != 0 => {
                let e = io::ErrorKind::NotFound;
                return Err(io::Error::new(
                    if k == REP_ERR_UNKNOWN {
                        e
                    } else {
                        io::ErrorKind::Other
                    },
                    format!("export '{}': {}", uri.export, option_error(k, &data)),
                ));
            }
            k => return Err(proto(format!("unexpected option reply type {k}"))),
        }
    }
    if !got_export {
        return Err(proto(
            "the server accepted GO without describing the export",
        ));
    }
    let min = info.min_block;
    if !min.is_power_of_two()
        || min > 64 * 1024
        || !info.preferred_block.is_power_of_two()
        || info.max_payload < min
    {
        return Err(proto(format!(
            "nonsensical block sizes (minimum {min}, preferred {}, maximum {})",
            info.preferred_block, info.max_payload
        )));
    }
    // Payloads above 32 MiB gain nothing and let a server make us allocate without bound.
    info.max_payload = info.max_payload.min(32 << 20) / min * min;
    let df = structured && tflags & TF_SEND_DF != 0;
    Ok((s, info, structured, df))
}

impl<B: ClientBuf> Connection<B> {
    /// Connect to `uri` and negotiate; must run inside a tokio runtime, which then runs
    /// the connection's tasks.
    pub async fn connect(uri: &NbdUri, opts: &ClientOptions) -> io::Result<Connection<B>> {
        let (stream, info, structured, df) = tokio::time::timeout(opts.connect_timeout, async {
            let s = open_stream(uri).await?;
            handshake(s, uri, opts).await
        })
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no NBD handshake within {} ms",
                    opts.connect_timeout.as_millis()
                ),
            )
        })??;
        let (dead_tx, dead_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            inflight: Mutex::new(HashMap::new()),
            death: Mutex::new(None),
            dead_tx,
            next_cookie: AtomicU64::new(1),
            queued: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let (r, w) = tokio::io::split(stream);
        let writer = tokio::spawn(write_loop(
            BufWriter::with_capacity(256 << 10, w),
            rx,
            shared.clone(),
            df,
        ));
        let reader = tokio::spawn(read_loop(
            BufReader::with_capacity(256 << 10, r),
            shared.clone(),
            structured,
            info.max_payload,
        ));
        let watchdog = tokio::spawn(watchdog(shared.clone(), opts.io_timeout));
        {
            let shared = shared.clone();
            tokio::spawn(async move {
                let _ = writer.await;
                let _ = reader.await;
                watchdog.abort();
                shared.die(Death::Closed);
                // Everything still in flight is lost; its buffers go back to the callers.
                let left: Vec<InFlight<B>> =
                    shared.inflight.lock().drain().map(|(_, v)| v).collect();
                for f in left {
                    match f.cmd {
                        Some(cmd) => {
                            let _ = f.reply.send(Outcome::Lost(cmd));
                        }
                        None => unreachable!("the writer gives its command back before exiting"),
                    }
                }
            });
        }
        Ok(Connection {
            tx,
            shared,
            dead_rx,
            info,
            df,
        })
    }

    /// The export as the server described it.
    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    /// Send a request and wait for its outcome.
    pub async fn request(&self, cmd: Command<B>) -> Outcome<B> {
        let (reply, rx) = oneshot::channel();
        self.shared.queued.fetch_add(1, Relaxed);
        if let Err(mpsc::error::SendError(p)) = self.tx.send(Pending { cmd, reply }) {
            self.shared.queued.fetch_sub(1, Relaxed);
            return Outcome::Lost(p.cmd);
        }
        let r = rx
            .await
            .expect("every request is answered, also when the connection dies");
        self.shared.queued.fetch_sub(1, Relaxed);
        r
    }

    /// Requests queued or in flight on this connection.
    pub fn load(&self) -> u64 {
        self.shared.queued.load(Relaxed)
    }

    pub fn is_dead(&self) -> bool {
        *self.dead_rx.borrow()
    }

    /// Wait until the connection has ended; say why.
    pub async fn closed(&self) -> Death {
        let mut rx = self.dead_rx.clone();
        let _ = rx.wait_for(|d| *d).await;
        self.shared.death.lock().clone().unwrap_or(Death::Closed)
    }

    /// End the connection; requests in flight come back as [`Outcome::Lost`].
    pub fn close(&self) {
        self.shared.die(Death::Closed);
    }

    /// Whether reads ask for one data chunk (DF).
    pub fn df(&self) -> bool {
        self.df
    }
}

impl<B: ClientBuf> Drop for Connection<B> {
    fn drop(&mut self) {
        self.shared.die(Death::Closed);
    }
}

async fn watchdog<B>(shared: Arc<Shared<B>>, timeout: Duration) {
    let tick = (timeout / 4).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(tick).await;
        let oldest = shared.inflight.lock().values().map(|f| f.sent).min();
        if let Some(t) = oldest {
            if t.elapsed() > timeout {
                shared.die(Death::Timeout(timeout));
                return;
            }
        }
    }
}

async fn write_loop<W, B>(
    mut w: BufWriter<W>,
    mut rx: mpsc::UnboundedReceiver<Pending<B>>,
    shared: Arc<Shared<B>>,
    df: bool,
) where
    W: AsyncWrite + Unpin,
    B: ClientBuf,
{
    let mut dead = shared.dead_tx.subscribe();
    'outer: loop {
        let first = tokio::select! {
            p = rx.recv() => match p { Some(p) => p, None => break },
            _ = dead.wait_for(|d| *d) => break,
        };
        let mut next = Some(first);
        while let Some(p) = next.take() {
            let cookie = shared.next_cookie.fetch_add(1, Relaxed);
            let hdr = encode_request(&p.cmd.header(cookie, df));
            let is_write = matches!(p.cmd, Command::Write { .. });
            let Pending { cmd, reply } = p;
            // Register before sending: the reply may come as soon as the header is out.
            let held = if is_write {
                shared.inflight.lock().insert(
                    cookie,
                    InFlight {
                        cmd: None,
                        reply,
                        sent: Instant::now(),
                        early: None,
                    },
                );
                Some(cmd)
            } else {
                shared.inflight.lock().insert(
                    cookie,
                    InFlight {
                        cmd: Some(cmd),
                        reply,
                        sent: Instant::now(),
                        early: None,
                    },
                );
                None
            };
            let sent = tokio::select! {
                r = async {
                    w.write_all(&hdr).await?;
                    if let Some(Command::Write { buf, .. }) = &held {
                        w.write_all(buf.bytes()).await?;
                    }
                    io::Result::Ok(())
                } => r,
                _ = dead.wait_for(|d| *d) => Err(io::Error::other("closed")),
            };
            if let Some(cmd) = held {
                // Hand the write's buffer to its entry (or finish it, if answered already).
                let mut map = shared.inflight.lock();
                let f = map
                    .get_mut(&cookie)
                    .expect("only the writer completes a payload in flight");
                match f.early.take() {
                    Some(r) if sent.is_ok() => {
                        let f = map.remove(&cookie).expect("present");
                        drop(map);
                        let _ = f.reply.send(match r {
                            Ok(()) => Outcome::Done(cmd),
                            Err(e) => Outcome::Failed(cmd, e),
                        });
                    }
                    _ => f.cmd = Some(cmd),
                }
            }
            if let Err(e) = sent {
                shared.die(Death::Io(format!("sending: {e}")));
                break 'outer;
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = w.flush().await {
            shared.die(Death::Io(format!("sending: {e}")));
            break;
        }
    }
    // Nothing more may be queued; what was is lost (the callers retry elsewhere).
    rx.close();
    while let Ok(p) = rx.try_recv() {
        let _ = p.reply.send(Outcome::Lost(p.cmd));
    }
    let _ = w.shutdown().await;
}

/// The byte ranges of a read filled so far (checked for overlap and completeness).
#[derive(Default)]
struct Coverage(Vec<(u64, u64)>);

impl Coverage {
    fn add(&mut self, start: u64, end: u64) -> bool {
        if self.0.iter().any(|&(s, e)| start < e && s < end) {
            return false;
        }
        self.0.push((start, end));
        true
    }
    fn total(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }
}

/// A read whose structured reply is still arriving.
struct Partial {
    coverage: Coverage,
    error: Option<io::Error>,
}

async fn read_loop<R, B>(
    mut r: BufReader<R>,
    shared: Arc<Shared<B>>,
    structured: bool,
    max_payload: u32,
) where
    R: AsyncRead + Unpin,
    B: ClientBuf,
{
    let mut dead = shared.dead_tx.subscribe();
    let mut partial: HashMap<u64, Partial> = HashMap::new();
    let r = tokio::select! {
        r = read_replies(&mut r, &shared, structured, max_payload, &mut partial) => r,
        _ = dead.wait_for(|d| *d) => return,
    };
    match r {
        Err(Fail::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            shared.die(Death::Io("the server closed the connection".into()))
        }
        Err(Fail::Io(e)) => shared.die(Death::Io(e.to_string())),
        Err(Fail::Proto(m)) => shared.die(Death::Protocol(m)),
        Ok(()) => shared.die(Death::Closed),
    }
}

enum Fail {
    Io(io::Error),
    Proto(String),
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Fail {
        Fail::Io(e)
    }
}

fn finish<B>(shared: &Shared<B>, cookie: u64, r: Result<(), io::Error>) {
    let mut map = shared.inflight.lock();
    let Some(f) = map.get_mut(&cookie) else {
        return;
    };
    if f.cmd.is_none() {
        // The writer is still sending this request's payload: it finishes it.
        f.early = Some(r);
        return;
    }
    let f = map.remove(&cookie).expect("present");
    drop(map);
    let cmd = f.cmd.expect("checked");
    let _ = f.reply.send(match r {
        Ok(()) => Outcome::Done(cmd),
        Err(e) => Outcome::Failed(cmd, e),
    });
}

/// Read `len` payload bytes of a read reply into its buffer at `at`. The command is taken
/// out of the table while the bytes arrive and put back after.
async fn read_into<R: AsyncRead + Unpin, B: ClientBuf>(
    r: &mut R,
    shared: &Shared<B>,
    cookie: u64,
    at: usize,
    len: usize,
) -> Result<(), Fail> {
    let cmd = shared
        .inflight
        .lock()
        .get_mut(&cookie)
        .and_then(|f| f.cmd.take())
        .expect("caller checked the cookie is a read in flight");
    // Put it back however this ends (also when the read is cancelled because the
    // connection died): the connection's end hands it to the caller as lost.
    let mut held = PutBack {
        shared,
        cookie,
        cmd: Some(cmd),
    };
    match held.cmd.as_mut() {
        Some(Command::Read { buf, .. }) => r.read_exact(&mut buf.bytes_mut()[at..at + len]).await?,
        _ => unreachable!("caller checked"),
    };
    Ok(())
}

struct PutBack<'a, B> {
    shared: &'a Shared<B>,
    cookie: u64,
    cmd: Option<Command<B>>,
}

impl<B> Drop for PutBack<'_, B> {
    fn drop(&mut self) {
        if let Some(f) = self.shared.inflight.lock().get_mut(&self.cookie) {
            f.cmd = self.cmd.take();
        }
    }
}

/// What kind of request a cookie belongs to and, for reads, where and how long.
fn lookup<B: ClientBuf>(shared: &Shared<B>, cookie: u64) -> Result<Option<(u64, u64)>, Fail> {
    let map = shared.inflight.lock();
    let f = map
        .get(&cookie)
        .ok_or_else(|| Fail::Proto(format!("reply for unknown cookie {cookie:#x}")))?;
    Ok(match &f.cmd {
        Some(Command::Read { offset, buf }) => Some((*offset, buf.bytes().len() as u64)),
        _ => None,
    })
}

async fn read_replies<R: AsyncRead + Unpin, B: ClientBuf>(
    r: &mut R,
    shared: &Shared<B>,
    structured: bool,
    max_payload: u32,
    partial: &mut HashMap<u64, Partial>,
) -> Result<(), Fail> {
    loop {
        let magic = r.read_u32().await?;
        match magic {
            SIMPLE_REPLY_MAGIC => {
                let error = r.read_u32().await?;
                let cookie = r.read_u64().await?;
                let read = lookup(shared, cookie)?;
                if partial.contains_key(&cookie) {
                    return Err(Fail::Proto(
                        "simple reply in the middle of a structured one".into(),
                    ));
                }
                if error != 0 {
                    finish(shared, cookie, Err(errno(error)));
                    continue;
                }
                if let Some((_, len)) = read {
                    if structured {
                        return Err(Fail::Proto(
                            "simple reply carrying read data after structured replies were agreed"
                                .into(),
                        ));
                    }
                    read_into(r, shared, cookie, 0, len as usize).await?;
                }
                finish(shared, cookie, Ok(()));
            }
            STRUCTURED_REPLY_MAGIC if structured => {
                let flags = r.read_u16().await?;
                let kind = r.read_u16().await?;
                let cookie = r.read_u64().await?;
                let length = r.read_u32().await?;
                let read = lookup(shared, cookie)?;
                let p = partial.entry(cookie).or_insert_with(|| Partial {
                    coverage: Coverage::default(),
                    error: None,
                });
                match kind {
                    REPLY_TYPE_NONE => {
                        if length != 0 || flags & REPLY_FLAG_DONE == 0 {
                            return Err(Fail::Proto("NONE chunk with data or without DONE".into()));
                        }
                    }
                    REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE => {
                        let Some((start, len)) = read else {
                            return Err(Fail::Proto("read data in the reply to a non-read".into()));
                        };
                        if length < 8 || length as u64 > max_payload as u64 + 12 {
                            return Err(Fail::Proto(format!("data chunk of {length} bytes")));
                        }
                        let off = r.read_u64().await?;
                        let n = if kind == REPLY_TYPE_OFFSET_DATA {
                            (length - 8) as u64
                        } else {
                            if length != 12 {
                                return Err(Fail::Proto("hole chunk of the wrong size".into()));
                            }
                            r.read_u32().await? as u64
                        };
                        let end = off.checked_add(n);
                        if n == 0 || off < start || end.is_none_or(|e| e > start + len) {
                            return Err(Fail::Proto(format!(
                                "chunk [{off}, +{n}) outside the read [{start}, +{len})"
                            )));
                        }
                        if !p.coverage.add(off, off + n) {
                            return Err(Fail::Proto("chunks of a read overlap".into()));
                        }
                        let at = (off - start) as usize;
                        if kind == REPLY_TYPE_OFFSET_DATA {
                            read_into(r, shared, cookie, at, n as usize).await?;
                        } else {
                            let mut map = shared.inflight.lock();
                            if let Some(Command::Read { buf, .. }) =
                                map.get_mut(&cookie).and_then(|f| f.cmd.as_mut())
                            {
                                buf.bytes_mut()[at..at + n as usize].fill(0);
                            }
                        }
                    }
                    k if k & (1 << 15) != 0 => {
                        if !(6..=6 + 4096 + 8).contains(&length) {
                            return Err(Fail::Proto(format!("error chunk of {length} bytes")));
                        }
                        let mut d = vec![0u8; length as usize];
                        r.read_exact(&mut d).await?;
                        let e = u32::from_be_bytes(d[0..4].try_into().expect("4 bytes"));
                        let mlen = u16::from_be_bytes([d[4], d[5]]) as usize;
                        if e == 0 || 6 + mlen > d.len() {
                            return Err(Fail::Proto("malformed error chunk".into()));
                        }
                        let msg = String::from_utf8_lossy(&d[6..6 + mlen]).to_string();
                        let err = errno(e);
                        p.error.get_or_insert_with(|| {
                            if msg.is_empty() {
                                err
                            } else {
                                io::Error::new(err.kind(), format!("{err}: {msg}"))
                            }
                        });
                    }
                    k => return Err(Fail::Proto(format!("unknown reply chunk type {k}"))),
                }
                if flags & REPLY_FLAG_DONE != 0 {
                    let p = partial.remove(&cookie).expect("inserted above");
                    let res = match (p.error, read) {
                        (Some(e), _) => Err(e),
                        (None, Some((_, len))) if p.coverage.total() != len => {
                            // Bytes of the read left unfilled: never hand them on, and
                            // trust nothing more from this server.
                            return Err(Fail::Proto(format!(
                                "the server answered {} of {len} bytes of a read",
                                p.coverage.total()
                            )));
                        }
                        _ => Ok(()),
                    };
                    finish(shared, cookie, res);
                }
            }
            m => return Err(Fail::Proto(format!("bad reply magic {m:#x}"))),
        }
    }
}
