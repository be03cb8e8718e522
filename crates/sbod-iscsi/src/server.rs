//! The target: listeners, admission, the login phase and the full feature phase.
//!
//! Per connection, one task reads PDUs and runs each SCSI command in its own task (replies
//! go out in completion order, tagged by the initiator's task tag); one task writes PDUs,
//! numbering them (StatSN) as they go out. Sessions have one connection each
//! (MaxConnections=1; an initiator opens several sessions for more), ErrorRecoveryLevel 0.
//!
//! No client can exhaust the server ([`Limits`], as the NBD server's): write and read
//! payloads draw on one byte budget shared by every connection and on a per-connection one;
//! connections are counted, server-wide and per client address; the login and a started
//! PDU each have a deadline; an idle connection is pinged (NOP-In) and closed if it does not
//! answer. A malformed PDU gets a Reject or closes only its own connection.

use crate::login::{self, Chap, Params};
use crate::pdu::*;
use crate::pr::Nexus;
use crate::scsi::{DataIn, Done, Lu, MAX_TRANSFER};
use crate::sense;
use sbod_nbd::Backend;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::timeout;

/// One target: an IQN with its volume as LUN 0.
pub struct Target<B: Backend> {
    pub iqn: String,
    pub alias: Option<String>,
    pub lu: Arc<Lu<B>>,
    /// CHAP the initiator must pass (none: no authentication).
    pub chap: Option<Chap>,
    /// Initiator names allowed to log in; empty: any.
    pub initiators: Vec<String>,
}

/// `HOST:PORT` for `--iscsi`; addresses other than loopback need `allow_remote`.
pub fn parse_listen(s: &str, allow_remote: bool) -> Result<SocketAddr, String> {
    let addr = s
        .to_socket_addrs()
        .map_err(|e| format!("--iscsi '{s}' is not HOST:PORT ({e}); e.g. 127.0.0.1:3260"))?
        .next()
        .ok_or_else(|| format!("--iscsi '{s}' resolves to no address"))?;
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(format!(
            "{addr} is not a loopback address: sbod listens for iSCSI beyond this host only when asked (--allow-remote; set CHAP and an initiator allow-list too)"
        ));
    }
    Ok(addr)
}

/// Counters for metrics.
#[derive(Default, Debug)]
pub struct Stats {
    pub connections: AtomicU64,
    pub active: AtomicU64,
    pub commands: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    /// Commands that ended in CHECK CONDITION or a conflict.
    pub errors: AtomicU64,
    /// PDUs rejected or connections dropped for breaking the protocol.
    pub protocol_errors: AtomicU64,
    /// Logins refused (unknown target, authentication, allow-list).
    pub login_failures: AtomicU64,
    /// Connections refused for the connection limits.
    pub refused: AtomicU64,
    pub timeouts: AtomicU64,
}

/// What keeps initiators from exhausting the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of command payload (write data received, read data not yet sent) held at once
    /// by all connections together.
    pub inflight_bytes: u64,
    pub max_connections: usize,
    pub max_per_client: usize,
    /// The login must be over by then.
    pub login_timeout: Duration,
    /// Once a PDU's first byte arrives the rest must follow within this, and the initiator
    /// must take our PDUs within this.
    pub io_timeout: Duration,
    /// A connection silent this long is sent a NOP-In; silent as long again, it is closed.
    pub nop_interval: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            inflight_bytes: 512 << 20,
            max_connections: 256,
            max_per_client: 64,
            login_timeout: Duration::from_secs(30),
            io_timeout: Duration::from_secs(60),
            nop_interval: Duration::from_secs(30),
        }
    }
}

/// Commands in flight per connection (the CmdSN window).
const QUEUE_DEPTH: u32 = 128;
/// Payload bytes in flight per connection.
const CONN_BUDGET: usize = 64 << 20;
/// The largest data-out a command may announce (COMPARE AND WRITE: twice a transfer).
const MAX_DATA_OUT: u32 = (2 * MAX_TRANSFER) as u32;
const IO_BUF: usize = 256 << 10;
const TASK_SET_FULL: u8 = 0x28;

struct Shared<B: Backend> {
    targets: Arc<Vec<Arc<Target<B>>>>,
    stats: Arc<Stats>,
    limits: Limits,
    budget: Arc<Semaphore>,
    admission: Admission,
    tsih: AtomicU16,
    /// Live sessions by I_T nexus, to end an old one an initiator reinstates.
    sessions: parking_lot::Mutex<HashMap<Nexus, (u64, Arc<tokio::sync::Notify>)>>,
    next_conn: AtomicU64,
}

struct Admission {
    max: usize,
    per_client: usize,
    open: parking_lot::Mutex<(usize, HashMap<IpAddr, usize>)>,
}

struct Ticket<'a> {
    adm: &'a Admission,
    ip: IpAddr,
}

impl Admission {
    fn admit(&self, ip: IpAddr) -> Option<Ticket<'_>> {
        let mut open = self.open.lock();
        let n = open.1.get(&ip).copied().unwrap_or(0);
        if open.0 >= self.max || n >= self.per_client {
            return None;
        }
        open.1.insert(ip, n + 1);
        open.0 += 1;
        Some(Ticket { adm: self, ip })
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut open = self.adm.open.lock();
        open.0 -= 1;
        if let Some(n) = open.1.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.ip);
            }
        }
    }
}

pub struct Server<B: Backend> {
    targets: Vec<Arc<Target<B>>>,
    limits: Limits,
    stats: Arc<Stats>,
}

impl<B: Backend> Server<B> {
    pub fn new(targets: Vec<Target<B>>) -> Server<B> {
        assert!(!targets.is_empty(), "a server needs a target");
        Server {
            targets: targets.into_iter().map(Arc::new).collect(),
            limits: Limits::default(),
            stats: Default::default(),
        }
    }

    pub fn with_limits(mut self, l: Limits) -> Server<B> {
        self.limits = l;
        self
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Bind the listeners (so a port in use is an error at once), then serve until
    /// `shutdown` completes; in-flight commands finish and every volume is flushed.
    pub async fn bind(self, listen: &[SocketAddr]) -> io::Result<Bound<B>> {
        let mut ls = Vec::new();
        for a in listen {
            let l = TcpListener::bind(a)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("binding iSCSI {a}: {e}")))?;
            ls.push(l);
        }
        Ok(Bound { server: self, ls })
    }

    pub async fn serve(
        self,
        listen: &[SocketAddr],
        shutdown: impl Future<Output = ()> + Send,
    ) -> io::Result<()> {
        self.bind(listen).await?.serve(shutdown).await
    }
}

/// A server with its listeners bound.
pub struct Bound<B: Backend> {
    server: Server<B>,
    ls: Vec<TcpListener>,
}

impl<B: Backend> Bound<B> {
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.ls.iter().filter_map(|l| l.local_addr().ok()).collect()
    }

    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> io::Result<()> {
        let s = self.server;
        let l = &s.limits;
        if l.inflight_bytes < MAX_DATA_OUT as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the iSCSI in-flight budget must be at least {MAX_DATA_OUT} bytes"),
            ));
        }
        let shared = Arc::new(Shared {
            targets: Arc::new(s.targets.clone()),
            stats: s.stats.clone(),
            limits: l.clone(),
            budget: Arc::new(Semaphore::new(
                l.inflight_bytes.min(Semaphore::MAX_PERMITS as u64) as usize,
            )),
            admission: Admission {
                max: l.max_connections.max(1),
                per_client: l.max_per_client.max(1),
                open: Default::default(),
            },
            tsih: AtomicU16::new(1),
            sessions: Default::default(),
            next_conn: AtomicU64::new(1),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = tokio::task::JoinSet::new();
        for lst in self.ls {
            let (shared, mut stop) = (shared.clone(), stop_rx.clone());
            tasks.spawn(async move {
                let mut conns = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        _ = stop.changed() => break,
                        r = lst.accept() => match r {
                            Ok((sock, peer)) => {
                                let _ = sock.set_nodelay(true);
                                while conns.try_join_next().is_some() {}
                                conns.spawn(connection(sock, peer, shared.clone(), stop.clone()));
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "accepting an iSCSI connection failed");
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                }
                while conns.join_next().await.is_some() {}
            });
        }
        shutdown.await;
        let _ = stop_tx.send(true);
        while tasks.join_next().await.is_some() {}
        let mut result = Ok(());
        for t in s.targets.iter() {
            if let Err(e) = t.lu.backend.flush().await {
                result = Err(io::Error::other(format!(
                    "flushing {} at shutdown: {e}",
                    t.iqn
                )));
            }
        }
        result
    }
}

async fn connection<B: Backend>(
    sock: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared<B>>,
    stop: watch::Receiver<bool>,
) {
    let Some(ticket) = shared.admission.admit(peer.ip()) else {
        let n = shared.stats.refused.fetch_add(1, Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(client = %peer.ip(), refused = n, "iSCSI connection refused: the connection limit is reached");
        }
        // The login is answered "too many connections" (class 3: target error, 0x06 out of
        // resources) so the initiator knows why.
        let _ = timeout(Duration::from_secs(5), refuse(sock)).await;
        return;
    };
    shared.stats.connections.fetch_add(1, Relaxed);
    shared.stats.active.fetch_add(1, Relaxed);
    let local = sock.local_addr().ok();
    let (rd, wr) = sock.into_split();
    let mut rd = BufReader::with_capacity(IO_BUF, rd);
    let mut wr = BufWriter::with_capacity(IO_BUF, wr);
    // Until the login is over, a server shutting down just drops the connection.
    let mut stop_login = stop.clone();
    let r = tokio::select! {
        r = timeout(
            shared.limits.login_timeout,
            login_phase(&mut rd, &mut wr, &shared, local),
        ) => r,
        _ = stop_login.changed() => Ok(Ok(None)),
    };
    match r {
        Ok(Ok(Some(sess))) => {
            if let Err(e) = full_feature(rd, wr, sess, &shared, stop).await {
                tracing::debug!(error = %e, "iSCSI connection ended");
            }
        }
        Ok(Ok(None)) => {}
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "iSCSI login ended");
        }
        Err(_) => {
            shared.stats.timeouts.fetch_add(1, Relaxed);
        }
    }
    shared.stats.active.fetch_sub(1, Relaxed);
    drop(ticket);
}

async fn refuse(sock: TcpStream) -> io::Result<()> {
    let (rd, mut wr) = sock.into_split();
    let mut rd = BufReader::new(rd);
    let pdu = read_pdu(&mut rd, false, false, 8192).await.map_err(to_io)?;
    let mut h = header(OP_LOGIN_RESP, 0);
    h[8..14].copy_from_slice(&pdu.bhs[8..14]);
    put32(&mut h, 16, pdu.itt());
    h[36] = 0x03;
    h[37] = 0x06;
    let mut out = Vec::new();
    encode_header(h, 0, false, &mut out);
    wr.write_all(&out).await?;
    wr.flush().await
}

fn to_io(e: ReadError) -> io::Error {
    match e {
        ReadError::Closed => io::Error::new(io::ErrorKind::UnexpectedEof, "closed"),
        ReadError::Io(e) => e,
        ReadError::Protocol(m) => io::Error::new(io::ErrorKind::InvalidData, m),
        ReadError::DataDigest(_) => io::Error::new(io::ErrorKind::InvalidData, "data digest"),
    }
}

/// A logged-in session (one connection).
struct Session<B: Backend> {
    target: Option<Arc<Target<B>>>,
    nexus: Nexus,
    params: Params,
    exp_cmd_sn: u32,
    stat_sn: u32,
    local: Option<SocketAddr>,
}

fn login_fail(class: u8, detail: u8, req: &Pdu, stat_sn: u32) -> Vec<u8> {
    let mut h = header(OP_LOGIN_RESP, 0);
    h[8..14].copy_from_slice(&req.bhs[8..14]);
    put32(&mut h, 16, req.itt());
    put32(&mut h, 24, stat_sn);
    put32(&mut h, 28, req.cmd_sn());
    put32(&mut h, 32, req.cmd_sn());
    h[36] = class;
    h[37] = detail;
    let mut out = Vec::new();
    encode_header(h, 0, false, &mut out);
    out
}

enum ChapState {
    None,
    Offered,
    Challenged { id: u8, challenge: [u8; 16] },
    Done,
}

async fn login_phase<B: Backend>(
    rd: &mut BufReader<OwnedReadHalf>,
    wr: &mut BufWriter<OwnedWriteHalf>,
    shared: &Shared<B>,
    local: Option<SocketAddr>,
) -> io::Result<Option<Session<B>>> {
    let mut params = Params::default();
    let mut stat_sn: u32 = 1;
    let mut first: Option<Pdu> = None;
    let mut initiator = String::new();
    let mut discovery = false;
    let mut target: Option<Arc<Target<B>>> = None;
    let mut chap = ChapState::None;
    let mut sent_tpgt = false;
    let mut declared = false;
    let mut pending_text: Vec<u8> = Vec::new();
    for _round in 0..64 {
        let pdu = match read_pdu(rd, false, false, 8192).await {
            Ok(p) => p,
            Err(ReadError::Closed) => return Ok(None),
            Err(e) => {
                shared.stats.protocol_errors.fetch_add(1, Relaxed);
                return Err(to_io(e));
            }
        };
        if pdu.opcode() != OP_LOGIN_REQ {
            shared.stats.protocol_errors.fetch_add(1, Relaxed);
            // 0x020b: invalid request during login.
            return fail(shared, wr, login_fail(2, 0x0b, &pdu, stat_sn)).await;
        }
        let flags = pdu.flags();
        let (transit, cont) = (flags & 0x80 != 0, flags & 0x40 != 0);
        let (csg, nsg) = ((flags >> 2) & 3, flags & 3);
        if pdu.bhs[3] > 0 || pdu.bhs[2] < pdu.bhs[3] {
            return fail(shared, wr, login_fail(2, 0x05, &pdu, stat_sn)).await;
        }
        if let Some(f) = &first {
            if f.bhs[8..14] != pdu.bhs[8..14] || f.itt() != pdu.itt() {
                return fail(shared, wr, login_fail(2, 0x00, &pdu, stat_sn)).await;
            }
        }
        if csg == 2 || csg == 3 || (transit && (nsg == 2 || nsg <= csg)) || (transit && cont) {
            return fail(shared, wr, login_fail(2, 0x00, &pdu, stat_sn)).await;
        }
        pending_text.extend_from_slice(&pdu.data);
        if pending_text.len() > 64 << 10 {
            return fail(shared, wr, login_fail(2, 0x00, &pdu, stat_sn)).await;
        }
        let mut resp: Vec<(String, String)> = Vec::new();
        if cont {
            // More text follows: answer empty, stay in the stage.
            let h = login_resp(&pdu, 0, csg, 0, 0, stat_sn);
            stat_sn = stat_sn.wrapping_add(1);
            write_login(wr, h, &[]).await?;
            continue;
        }
        let keys = match login::parse_keys(&std::mem::take(&mut pending_text)) {
            Ok(k) => k,
            Err(_) => return fail(shared, wr, login_fail(2, 0x00, &pdu, stat_sn)).await,
        };
        let get = |k: &str| keys.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.as_str());
        if first.is_none() {
            let Some(name) = get("InitiatorName") else {
                return fail(shared, wr, login_fail(2, 0x07, &pdu, stat_sn)).await;
            };
            initiator = name.to_string();
            discovery = match get("SessionType").unwrap_or("Normal") {
                "Discovery" => true,
                "Normal" => false,
                _ => return fail(shared, wr, login_fail(2, 0x00, &pdu, stat_sn)).await,
            };
            if be16(&pdu.bhs, 14) != 0 {
                // Adding a connection to a session (MC/S): not offered.
                return fail(shared, wr, login_fail(2, 0x0a, &pdu, stat_sn)).await;
            }
            if !discovery {
                let Some(tn) = get("TargetName") else {
                    return fail(shared, wr, login_fail(2, 0x07, &pdu, stat_sn)).await;
                };
                let Some(t) = shared.targets.iter().find(|t| t.iqn == tn) else {
                    return fail(shared, wr, login_fail(2, 0x03, &pdu, stat_sn)).await;
                };
                if !t.initiators.is_empty() && !t.initiators.iter().any(|i| i == &initiator) {
                    tracing::warn!(initiator = %initiator, target = %tn, "iSCSI login refused: the initiator is not on the target's allow-list");
                    return fail(shared, wr, login_fail(2, 0x02, &pdu, stat_sn)).await;
                }
                target = Some(t.clone());
            }
            first = Some(pdu.clone());
        }
        let need_chap = target.as_ref().and_then(|t| t.chap.clone());
        for (k, v) in &keys {
            match k.as_str() {
                "InitiatorName" | "InitiatorAlias" | "SessionType" | "TargetName" => {}
                "AuthMethod" if csg == 0 => {
                    let offered: Vec<&str> = v.split(',').collect();
                    let pick = if need_chap.is_some() {
                        offered.contains(&"CHAP").then_some("CHAP")
                    } else {
                        offered.contains(&"None").then_some("None")
                    };
                    match pick {
                        Some(m) => {
                            resp.push((k.clone(), m.into()));
                            if m == "CHAP" {
                                chap = ChapState::Offered;
                            }
                        }
                        None => return fail(shared, wr, login_fail(2, 0x01, &pdu, stat_sn)).await,
                    }
                }
                "CHAP_A" if matches!(chap, ChapState::Offered) => {
                    if !v.split(',').any(|a| a == "5") {
                        return fail(shared, wr, login_fail(2, 0x01, &pdu, stat_sn)).await;
                    }
                    let id: u8 = rand::random();
                    let challenge: [u8; 16] = rand::random();
                    resp.push(("CHAP_A".into(), "5".into()));
                    resp.push(("CHAP_I".into(), id.to_string()));
                    resp.push(("CHAP_C".into(), login::hex(&challenge)));
                    chap = ChapState::Challenged { id, challenge };
                }
                "CHAP_N" | "CHAP_R" | "CHAP_I" | "CHAP_C" => {}
                _ => match login::negotiate(&mut params, k, v, discovery) {
                    Some(r) if r.is_empty() => {}
                    Some(r) => resp.push((k.clone(), r)),
                    None => resp.push((k.clone(), "NotUnderstood".into())),
                },
            }
        }
        if let (ChapState::Challenged { id, challenge }, Some(c)) = (&chap, &need_chap) {
            if let (Some(n), Some(r)) = (get("CHAP_N"), get("CHAP_R")) {
                let ok = n == c.user
                    && login::decode_binary(r).is_some_and(|r| {
                        login::same(&r, &login::chap_response(*id, &c.secret, challenge))
                    });
                if !ok {
                    tracing::warn!(initiator = %initiator, "iSCSI login refused: CHAP authentication failed");
                    return fail(shared, wr, login_fail(2, 0x01, &pdu, stat_sn)).await;
                }
                if let (Some(ii), Some(ic)) = (get("CHAP_I"), get("CHAP_C")) {
                    // Mutual: the target proves its own secret.
                    let (Some((tu, ts)), Ok(ii), Some(ic)) =
                        (&c.mutual, ii.parse::<u8>(), login::decode_binary(ic))
                    else {
                        return fail(shared, wr, login_fail(2, 0x01, &pdu, stat_sn)).await;
                    };
                    if login::same(&ic, challenge) || ic.len() < 8 {
                        // A reflected or trivial challenge.
                        return fail(shared, wr, login_fail(2, 0x01, &pdu, stat_sn)).await;
                    }
                    resp.push(("CHAP_N".into(), tu.clone()));
                    resp.push((
                        "CHAP_R".into(),
                        login::hex(&login::chap_response(ii, ts, &ic)),
                    ));
                }
                chap = ChapState::Done;
            }
        }
        let authed = need_chap.is_none() || matches!(chap, ChapState::Done);
        if !discovery && !sent_tpgt {
            resp.push(("TargetPortalGroupTag".into(), "1".into()));
            if let Some(a) = target.as_ref().and_then(|t| t.alias.clone()) {
                resp.push(("TargetAlias".into(), a));
            }
            sent_tpgt = true;
        }
        if csg == 1 && !declared {
            resp.push((
                "MaxRecvDataSegmentLength".into(),
                login::OUR_RECV_DSL.to_string(),
            ));
            declared = true;
        }
        if !authed && (csg == 1 || (transit && matches!(chap, ChapState::None))) {
            tracing::warn!(initiator = %initiator, "iSCSI login refused: the target requires CHAP");
            return fail(shared, wr, login_fail(2, 0x01, &pdu, stat_sn)).await;
        }
        let go = transit && authed;
        let done = go && nsg == 3;
        let tsih = if done {
            let mut t = shared.tsih.fetch_add(1, Relaxed);
            if t == 0 {
                t = shared.tsih.fetch_add(1, Relaxed);
            }
            t
        } else {
            0
        };
        let h = login_resp(
            &pdu,
            if go { 0x80 } else { 0 },
            csg,
            if go { nsg } else { 0 },
            tsih,
            stat_sn,
        );
        stat_sn = stat_sn.wrapping_add(1);
        write_login(wr, h, &login::encode_keys(&resp)).await?;
        if done {
            let f = first.unwrap();
            return Ok(Some(Session {
                target,
                nexus: Nexus {
                    initiator,
                    isid: f.bhs[8..14].try_into().unwrap(),
                },
                params,
                exp_cmd_sn: pdu.cmd_sn(),
                stat_sn,
                local,
            }));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "the login did not end",
    ))
}

async fn fail<B: Backend, T>(
    shared: &Shared<B>,
    wr: &mut BufWriter<OwnedWriteHalf>,
    out: Vec<u8>,
) -> io::Result<Option<T>> {
    shared.stats.login_failures.fetch_add(1, Relaxed);
    wr.write_all(&out).await?;
    wr.flush().await?;
    Ok(None)
}

fn login_resp(req: &Pdu, tflag: u8, csg: u8, nsg: u8, tsih: u16, stat_sn: u32) -> [u8; BHS_LEN] {
    let mut h = header(OP_LOGIN_RESP, tflag | csg << 2 | nsg);
    h[8..14].copy_from_slice(&req.bhs[8..14]);
    put16(&mut h, 14, tsih);
    put32(&mut h, 16, req.itt());
    put32(&mut h, 24, stat_sn);
    put32(&mut h, 28, req.cmd_sn());
    put32(&mut h, 32, req.cmd_sn().wrapping_add(QUEUE_DEPTH - 1));
    h
}

async fn write_login<W: AsyncWrite + Unpin>(
    wr: &mut W,
    h: [u8; BHS_LEN],
    data: &[u8],
) -> io::Result<()> {
    let mut out = Vec::new();
    encode_header(h, data.len(), false, &mut out);
    encode_data(data, false, &mut out);
    wr.write_all(&out).await?;
    wr.flush().await
}

/// How a PDU's StatSN field is filled as it goes out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stat {
    /// Not a StatSN field (Data-In without status).
    None,
    /// The current StatSN, not advanced (R2T, unsolicited NOP-In).
    Current,
    /// The current StatSN, advanced after.
    Advance,
}

struct OutPdu {
    bhs: [u8; BHS_LEN],
    data: std::ops::Range<usize>,
    stat: Stat,
}

/// PDUs for the writer, their data in one buffer, and what is held until they are sent.
struct Out {
    pdus: Vec<OutPdu>,
    data: Option<Box<dyn AsRef<[u8]> + Send>>,
    _held: Option<Held>,
    /// Close the connection after these.
    last: bool,
}

impl Out {
    fn one(bhs: [u8; BHS_LEN], data: Vec<u8>, stat: Stat) -> Out {
        Out {
            pdus: vec![OutPdu {
                bhs,
                data: 0..data.len(),
                stat,
            }],
            data: Some(Box::new(data)),
            _held: None,
            last: false,
        }
    }
}

struct DataBox<Buf>(DataIn<Buf>);
impl<Buf: AsRef<[u8]>> AsRef<[u8]> for DataBox<Buf> {
    fn as_ref(&self) -> &[u8] {
        self.0.slice()
    }
}

/// Payload budget held: server-wide and the connection's.
struct Held {
    _all: OwnedSemaphorePermit,
    _conn: OwnedSemaphorePermit,
    /// Wakes the connection's reader when commands wait for budget.
    freed: Arc<tokio::sync::Notify>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.freed.notify_one();
    }
}

/// A write collecting its data-out.
struct Pending<Buf> {
    cdb: [u8; 16],
    lun: u64,
    buf: Buf,
    edtl: u32,
    received: u32,
    /// Where the current sequence (unsolicited burst or R2T) ends.
    seq_end: u32,
    ttt: u32,
    next_data_sn: u32,
    r2t_sn: u32,
    held: Held,
}

struct Conn<B: Backend> {
    shared: Arc<Shared<B>>,
    target: Option<Arc<Target<B>>>,
    nexus: Arc<Nexus>,
    params: Params,
    exp_cmd_sn: Arc<AtomicU32>,
    tx: mpsc::Sender<Out>,
    budget: Arc<Semaphore>,
    slots: Arc<Semaphore>,
    /// Tasks running, by task tag, with their abort flag.
    running: Arc<parking_lot::Mutex<HashMap<u32, Arc<AtomicBool>>>>,
    pending: HashMap<u32, Pending<B::Buf>>,
    /// Commands waiting for payload budget, in order, while writes of this connection
    /// collect their data: the reader must go on reading those Data-Outs (waiting for
    /// budget instead would wait for itself). Bounded by QUEUE_DEPTH (then TASK SET FULL).
    deferred: std::collections::VecDeque<Pdu>,
    /// Unsolicited Data-Outs of deferred commands (each within FirstBurstLength).
    deferred_data: HashMap<u32, (usize, Vec<Pdu>)>,
    freed: Arc<tokio::sync::Notify>,
    next_ttt: u32,
    local: Option<SocketAddr>,
}

async fn full_feature<B: Backend>(
    mut rd: BufReader<OwnedReadHalf>,
    wr: BufWriter<OwnedWriteHalf>,
    sess: Session<B>,
    shared: &Arc<Shared<B>>,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let exp = Arc::new(AtomicU32::new(sess.exp_cmd_sn));
    let (tx, rx) = mpsc::channel::<Out>(256);
    let params = sess.params.clone();
    let writer = tokio::spawn(writer(
        wr,
        rx,
        sess.stat_sn,
        exp.clone(),
        params.clone(),
        shared.limits.io_timeout,
    ));
    // Reinstatement: a new login by the same I_T nexus ends the old session.
    let my_id = shared.next_conn.fetch_add(1, Relaxed);
    let kill = Arc::new(tokio::sync::Notify::new());
    if let Some((_, old)) = shared
        .sessions
        .lock()
        .insert(sess.nexus.clone(), (my_id, kill.clone()))
    {
        old.notify_one();
    }
    let mut c = Conn {
        shared: shared.clone(),
        target: sess.target,
        nexus: Arc::new(sess.nexus),
        params,
        exp_cmd_sn: exp,
        tx,
        budget: Arc::new(Semaphore::new(CONN_BUDGET)),
        slots: Arc::new(Semaphore::new(QUEUE_DEPTH as usize)),
        running: Default::default(),
        pending: HashMap::new(),
        deferred: Default::default(),
        deferred_data: HashMap::new(),
        freed: Default::default(),
        next_ttt: 1,
        local: sess.local,
    };
    let r = c.serve(&mut rd, &mut stop, &kill).await;
    {
        let mut s = shared.sessions.lock();
        if s.get(&c.nexus).is_some_and(|(id, _)| *id == my_id) {
            s.remove(&c.nexus);
        }
    }
    // Running commands finish (their writes complete) before the connection is gone.
    let _ = c.slots.acquire_many(QUEUE_DEPTH).await;
    drop(c);
    let _ = writer.await;
    r
}

fn sn_lt(a: u32, b: u32) -> bool {
    a != b && (b.wrapping_sub(a) as i32) > 0
}

impl<B: Backend> Conn<B> {
    async fn serve(
        &mut self,
        rd: &mut BufReader<OwnedReadHalf>,
        stop: &mut watch::Receiver<bool>,
        kill: &tokio::sync::Notify,
    ) -> io::Result<()> {
        let io_t = self.shared.limits.io_timeout;
        let nop = self.shared.limits.nop_interval;
        let mut pinged = false;
        loop {
            // Wait for a PDU's first byte; ping when idle, close when the ping is ignored.
            tokio::select! {
                r = timeout(nop, rd.fill_buf()) => match r {
                    Ok(Ok([])) => return Ok(()),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {
                        if pinged {
                            self.shared.stats.timeouts.fetch_add(1, Relaxed);
                            return Err(io::Error::new(io::ErrorKind::TimedOut, "the initiator did not answer a NOP-In"));
                        }
                        pinged = true;
                        let mut h = header(OP_NOP_IN, FLAG_F);
                        h[8..16].fill(0);
                        put32(&mut h, 16, NO_TAG);
                        put32(&mut h, 20, self.ttt());
                        let _ = self.tx.send(Out::one(h, Vec::new(), Stat::Current)).await;
                        continue;
                    }
                },
                _ = stop.changed() => return Ok(()),
                _ = kill.notified() => return Ok(()),
                _ = self.freed.notified(), if !self.deferred.is_empty() => {
                    self.run_deferred().await?;
                    continue;
                }
            }
            pinged = false;
            let p = self.params.clone();
            let pdu = match timeout(
                io_t,
                read_pdu(rd, p.header_digest, p.data_digest, p.recv_dsl),
            )
            .await
            {
                Err(_) => {
                    self.shared.stats.timeouts.fetch_add(1, Relaxed);
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "a PDU did not arrive in time",
                    ));
                }
                Ok(Ok(p)) => p,
                Ok(Err(ReadError::DataDigest(pdu))) => {
                    // The PDU is whole: reject it and go on (ERL 0 for the task, but the
                    // connection stays in sync).
                    self.shared.stats.protocol_errors.fetch_add(1, Relaxed);
                    if pdu.opcode() == OP_DATA_OUT || pdu.opcode() == OP_SCSI_CMD {
                        // The task cannot complete: end the connection (recovery level 0).
                        self.reject(&pdu, REJECT_DIGEST).await;
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "data digest mismatch",
                        ));
                    }
                    self.reject(&pdu, REJECT_DIGEST).await;
                    continue;
                }
                Ok(Err(ReadError::Closed)) => return Ok(()),
                Ok(Err(e)) => {
                    self.shared.stats.protocol_errors.fetch_add(1, Relaxed);
                    return Err(to_io(e));
                }
            };
            let r = match self.pdu(pdu).await {
                Ok(true) if !self.deferred.is_empty() => self.run_deferred().await.map(|_| true),
                r => r,
            };
            match r {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(e) => {
                    self.shared.stats.protocol_errors.fetch_add(1, Relaxed);
                    return Err(e);
                }
            }
        }
    }

    fn ttt(&mut self) -> u32 {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == NO_TAG {
            self.next_ttt = 1;
        }
        t
    }

    async fn send(&mut self, o: Out) {
        let _ = self.tx.send(o).await;
    }

    async fn reject(&mut self, pdu: &Pdu, reason: u8) {
        self.shared.stats.protocol_errors.fetch_add(1, Relaxed);
        let mut h = header(OP_REJECT, FLAG_F);
        h[2] = reason;
        put32(&mut h, 16, NO_TAG);
        self.send(Out::one(h, pdu.bhs.to_vec(), Stat::Advance))
            .await;
    }

    /// Accept a CmdSN: `false` if outside the window (the command is ignored, 4.2.2.1).
    fn take_cmd_sn(&self, pdu: &Pdu) -> bool {
        let sn = pdu.cmd_sn();
        let exp = self.exp_cmd_sn.load(Relaxed);
        if pdu.immediate() {
            return true;
        }
        let max = exp.wrapping_add(QUEUE_DEPTH - 1);
        if sn_lt(sn, exp) || sn_lt(max, sn) {
            return false;
        }
        self.exp_cmd_sn.store(sn.wrapping_add(1), Relaxed);
        true
    }

    /// Handle one PDU; `Ok(false)`: the connection ends (logout).
    async fn pdu(&mut self, pdu: Pdu) -> io::Result<bool> {
        let protocol = |m: &str| Err(io::Error::new(io::ErrorKind::InvalidData, m.to_string()));
        match pdu.opcode() {
            OP_NOP_OUT => {
                if pdu.itt() == NO_TAG {
                    // An answer to our NOP-In.
                    return Ok(true);
                }
                if !self.take_cmd_sn(&pdu) {
                    return Ok(true);
                }
                let mut h = header(OP_NOP_IN, FLAG_F);
                h[8..16].copy_from_slice(&pdu.bhs[8..16]);
                put32(&mut h, 16, pdu.itt());
                put32(&mut h, 20, NO_TAG);
                let mut d = pdu.data;
                d.truncate(self.params.send_dsl);
                self.send(Out::one(h, d, Stat::Advance)).await;
            }
            OP_SCSI_CMD => {
                if self.target.is_none() {
                    self.reject(&pdu, REJECT_PROTOCOL).await;
                    return Ok(true);
                }
                if !self.take_cmd_sn(&pdu) {
                    return Ok(true);
                }
                self.command(pdu, false).await?;
            }
            OP_DATA_OUT => self.data_out(pdu).await?,
            OP_TMF_REQ => {
                self.take_cmd_sn(&pdu);
                self.tmf(pdu).await;
            }
            OP_TEXT_REQ => {
                if !self.take_cmd_sn(&pdu) {
                    return Ok(true);
                }
                self.text(pdu).await;
            }
            OP_LOGOUT_REQ => {
                self.take_cmd_sn(&pdu);
                // Commands finish first; then the answer, and the connection closes.
                let _all = self.slots.clone().acquire_many_owned(QUEUE_DEPTH).await;
                let mut h = header(OP_LOGOUT_RESP, FLAG_F);
                put32(&mut h, 16, pdu.itt());
                h[2] = if pdu.flags() & 0x7f <= 1 { 0 } else { 2 };
                let mut o = Out::one(h, Vec::new(), Stat::Advance);
                o.last = true;
                self.send(o).await;
                return Ok(false);
            }
            OP_LOGIN_REQ => {
                self.reject(&pdu, REJECT_PROTOCOL).await;
                return protocol("a login request in the full feature phase");
            }
            OP_SNACK => self.reject(&pdu, REJECT_NOT_SUPPORTED).await,
            _ => self.reject(&pdu, REJECT_NOT_SUPPORTED).await,
        }
        Ok(true)
    }

    async fn text(&mut self, pdu: Pdu) {
        let keys = login::parse_keys(&pdu.data).unwrap_or_default();
        let mut out = Vec::new();
        if pdu.flags() & 0x40 != 0 {
            self.reject(&pdu, REJECT_NOT_SUPPORTED).await;
            return;
        }
        for (k, v) in keys {
            if k == "SendTargets" {
                for t in self.shared.targets.iter() {
                    let mine = match &self.target {
                        Some(my) => Arc::ptr_eq(my, t),
                        None => v == "All" || v == t.iqn,
                    };
                    let allowed =
                        t.initiators.is_empty() || t.initiators.contains(&self.nexus.initiator);
                    if !mine || !allowed {
                        continue;
                    }
                    out.push(("TargetName".to_string(), t.iqn.clone()));
                    if let Some(a) = self.local {
                        let addr = match a.ip() {
                            IpAddr::V6(ip) => format!("[{ip}]:{}", a.port()),
                            IpAddr::V4(ip) => format!("{ip}:{}", a.port()),
                        };
                        out.push(("TargetAddress".to_string(), format!("{addr},1")));
                    }
                }
            } else {
                out.push((k, "NotUnderstood".into()));
            }
        }
        let mut d = login::encode_keys(&out);
        d.truncate(self.params.send_dsl);
        let mut h = header(OP_TEXT_RESP, FLAG_F);
        put32(&mut h, 16, pdu.itt());
        put32(&mut h, 20, NO_TAG);
        self.send(Out::one(h, d, Stat::Advance)).await;
    }

    async fn tmf(&mut self, pdu: Pdu) {
        let func = pdu.flags() & 0x7f;
        let lun = pdu.lun();
        let response = match func {
            // ABORT TASK
            1 => {
                let tag = pdu.field32(20);
                if self.pending.remove(&tag).is_some() {
                    0
                } else if let Some(i) = self.deferred.iter().position(|p| p.itt() == tag) {
                    self.deferred.remove(i);
                    self.deferred_data.remove(&tag);
                    0
                } else if let Some(f) = self.running.lock().get(&tag) {
                    f.store(true, Relaxed);
                    0
                } else {
                    // Already answered (or never seen).
                    1
                }
            }
            // ABORT TASK SET, CLEAR TASK SET, LUN RESET
            2 | 4 | 5 => {
                if lun != 0 {
                    2
                } else {
                    self.pending.clear();
                    self.deferred.clear();
                    self.deferred_data.clear();
                    for f in self.running.lock().values() {
                        f.store(true, Relaxed);
                    }
                    0
                }
            }
            // CLEAR ACA, TARGET WARM/COLD RESET, TASK REASSIGN
            _ => 5,
        };
        // Aborted commands that are running still complete their writes; their answers
        // are dropped. The TMF answer comes once they are done.
        if response <= 1 {
            let _all = self.slots.clone().acquire_many_owned(QUEUE_DEPTH).await;
        }
        let mut h = header(OP_TMF_RESP, FLAG_F);
        h[2] = response;
        put32(&mut h, 16, pdu.itt());
        self.send(Out::one(h, Vec::new(), Stat::Advance)).await;
    }

    /// Budget for a command: at once, or waited for when nothing of this connection needs
    /// the reader to free it; `None`: the command waits in `deferred`.
    async fn budget_for(&mut self, bytes: u32) -> Option<Held> {
        let n = (bytes.max(1) as usize).min(CONN_BUDGET) as u32;
        let freed = self.freed.clone();
        if let Ok(c) = self.budget.clone().try_acquire_many_owned(n) {
            if let Ok(a) = self.shared.budget.clone().try_acquire_many_owned(n) {
                return Some(Held {
                    _all: a,
                    _conn: c,
                    freed,
                });
            }
        }
        if !self.pending.is_empty() {
            return None;
        }
        let c = self
            .budget
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("never closed");
        let a = self
            .shared
            .budget
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("never closed");
        Some(Held {
            _all: a,
            _conn: c,
            freed,
        })
    }

    /// Run the commands that waited for budget, in order, while there is budget.
    async fn run_deferred(&mut self) -> io::Result<()> {
        while let Some(p) = self.deferred.pop_front() {
            let itt = p.itt();
            let before = self.deferred.len();
            self.command(p, true).await?;
            if self.deferred.len() > before {
                // Still no budget: back to the front.
                let p = self.deferred.pop_back().expect("just pushed");
                self.deferred.push_front(p);
                break;
            }
            if let Some((_, outs)) = self.deferred_data.remove(&itt) {
                for d in outs {
                    self.data_out(d).await?;
                }
            }
        }
        Ok(())
    }

    async fn command(&mut self, pdu: Pdu, from_deferred: bool) -> io::Result<()> {
        if !from_deferred && !self.deferred.is_empty() {
            if self.deferred.len() >= QUEUE_DEPTH as usize
                || self.deferred.iter().any(|p| p.itt() == pdu.itt())
            {
                let mut cdb = [0u8; 16];
                cdb.copy_from_slice(&pdu.bhs[32..48]);
                let busy = Done {
                    status: TASK_SET_FULL,
                    sense: Vec::new(),
                    data: DataIn::None,
                };
                self.finish(
                    pdu.itt(),
                    pdu.lun(),
                    &cdb,
                    pdu.field32(20),
                    false,
                    busy,
                    None,
                )
                .await;
                return Ok(());
            }
            self.deferred.push_back(pdu);
            return Ok(());
        }
        let flags = pdu.flags();
        let (read, write) = (flags & 0x40 != 0, flags & 0x20 != 0);
        let itt = pdu.itt();
        let edtl = pdu.field32(20);
        let lun = pdu.lun();
        let mut cdb = [0u8; 16];
        cdb.copy_from_slice(&pdu.bhs[32..48]);
        self.shared.stats.commands.fetch_add(1, Relaxed);
        if itt == NO_TAG
            || self.pending.contains_key(&itt)
            || self.running.lock().contains_key(&itt)
        {
            self.reject(&pdu, REJECT_INVALID_FIELD).await;
            return Ok(());
        }
        if !pdu.ahs.is_empty() || (read && write) {
            // Extended CDBs and bidirectional commands are not offered.
            self.finish(
                itt,
                lun,
                &cdb,
                edtl,
                false,
                Done::check(sense::INVALID_OPCODE),
                None,
            )
            .await;
            return Ok(());
        }
        let imm = pdu.data.len() as u32;
        if !write {
            if imm > 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "data with a command that writes none",
                ));
            }
            let Some(held) = self
                .budget_for(edtl.min(MAX_TRANSFER as u32 + (64 << 10)))
                .await
            else {
                self.deferred.push_back(pdu);
                return Ok(());
            };
            self.spawn(itt, lun, cdb, edtl, None, held).await;
            return Ok(());
        }
        if imm > edtl || (imm > 0 && !self.params.immediate_data) || imm > self.params.first_burst {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "immediate data over what was negotiated",
            ));
        }
        // Unsolicited data that follows: up to FirstBurstLength, only without InitialR2T.
        let unsolicited_end = if flags & FLAG_F == 0 {
            if self.params.initial_r2t {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unsolicited Data-Out with InitialR2T=Yes",
                ));
            }
            edtl.min(self.params.first_burst)
        } else {
            imm
        };
        if edtl > MAX_DATA_OUT {
            if unsolicited_end > imm {
                // Its unsolicited data cannot be told from a protocol error: end here.
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a data-out over the limit",
                ));
            }
            self.finish(
                itt,
                lun,
                &cdb,
                edtl,
                false,
                Done::check(sense::INVALID_FIELD_CDB),
                None,
            )
            .await;
            return Ok(());
        }
        let Some(held) = self.budget_for(edtl).await else {
            self.deferred.push_back(pdu);
            return Ok(());
        };
        let mut buf = self.shared.targets[0].lu.backend.alloc(0);
        if let Some(t) = &self.target {
            buf = t.lu.backend.alloc(edtl as usize);
        }
        buf.as_mut()[..imm as usize].copy_from_slice(&pdu.data);
        let mut p = Pending {
            cdb,
            lun,
            buf,
            edtl,
            received: imm,
            seq_end: unsolicited_end,
            ttt: NO_TAG,
            next_data_sn: 0,
            r2t_sn: 0,
            held,
        };
        if p.received == edtl {
            let Pending { buf, held, .. } = p;
            self.spawn(itt, lun, cdb, edtl, Some(buf), held).await;
            return Ok(());
        }
        if p.received == p.seq_end {
            self.r2t(itt, &mut p).await;
        }
        self.pending.insert(itt, p);
        Ok(())
    }

    async fn r2t(&mut self, itt: u32, p: &mut Pending<B::Buf>) {
        let len = (p.edtl - p.received).min(self.params.max_burst);
        p.ttt = self.ttt();
        p.seq_end = p.received + len;
        p.next_data_sn = 0;
        let mut h = header(OP_R2T, FLAG_F);
        h[8..16].copy_from_slice(&p.lun.to_be_bytes());
        put32(&mut h, 16, itt);
        put32(&mut h, 20, p.ttt);
        put32(&mut h, 36, p.r2t_sn);
        put32(&mut h, 40, p.received);
        put32(&mut h, 44, len);
        p.r2t_sn += 1;
        self.send(Out::one(h, Vec::new(), Stat::Current)).await;
    }

    async fn data_out(&mut self, pdu: Pdu) -> io::Result<()> {
        let itt = pdu.itt();
        let Some(p) = self.pending.get_mut(&itt) else {
            if self.deferred.iter().any(|p| p.itt() == itt) {
                // Unsolicited data of a command waiting for budget: kept until it runs.
                let e = self.deferred_data.entry(itt).or_default();
                e.0 += pdu.data.len();
                if e.0 > self.params.first_burst as usize {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "unsolicited data over FirstBurstLength",
                    ));
                }
                e.1.push(pdu);
            }
            // Else a task aborted or answered early: its remaining data is dropped.
            return Ok(());
        };
        let ttt = pdu.field32(20);
        let offset = pdu.field32(40);
        let data_sn = pdu.field32(36);
        let len = pdu.data.len() as u32;
        let why = if ttt != p.ttt && !(ttt == NO_TAG && p.ttt == NO_TAG) {
            Some("a transfer tag not given")
        } else if data_sn != p.next_data_sn {
            Some("out of sequence (DataSN)")
        } else if offset != p.received || offset.checked_add(len).is_none_or(|e| e > p.seq_end) {
            Some("an offset or length not asked for")
        } else if pdu.final_bit() != (offset + len == p.seq_end) {
            Some("a sequence that ends where it should not")
        } else {
            None
        };
        if let Some(why) = why {
            // The stream is still in sync (the PDU's lengths were honoured): the command
            // fails with the reason, its later Data-Outs are dropped, the connection goes on.
            tracing::debug!(itt, "Data-Out refused: {why}");
            self.shared.stats.protocol_errors.fetch_add(1, Relaxed);
            let p = self.pending.remove(&itt).unwrap();
            let (lun, cdb, edtl) = (p.lun, p.cdb, p.edtl);
            drop(p);
            self.finish(
                itt,
                lun,
                &cdb,
                edtl,
                true,
                Done::check(sense::DATA_PHASE_ERROR),
                None,
            )
            .await;
            return Ok(());
        }
        p.buf.as_mut()[offset as usize..(offset + len) as usize].copy_from_slice(&pdu.data);
        p.received += len;
        p.next_data_sn += 1;
        if p.received == p.seq_end {
            if p.received == p.edtl {
                let p = self.pending.remove(&itt).unwrap();
                self.spawn(itt, p.lun, p.cdb, p.edtl, Some(p.buf), p.held)
                    .await;
            } else {
                let mut p = self.pending.remove(&itt).unwrap();
                self.r2t(itt, &mut p).await;
                self.pending.insert(itt, p);
            }
        }
        Ok(())
    }

    /// Run a command in its own task and send its answer.
    async fn spawn(
        &mut self,
        itt: u32,
        lun: u64,
        cdb: [u8; 16],
        edtl: u32,
        data: Option<B::Buf>,
        held: Held,
    ) {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        let flag = Arc::new(AtomicBool::new(false));
        self.running.lock().insert(itt, flag.clone());
        let target = self.target.clone().expect("a normal session");
        let nexus = self.nexus.clone();
        let tx = self.tx.clone();
        let running = self.running.clone();
        let params = self.params.clone();
        let stats = self.shared.stats.clone();
        tokio::spawn(async move {
            let done = if lun != 0 {
                other_lun(&cdb)
            } else {
                target.lu.execute(&nexus, &cdb, data).await
            };
            running.lock().remove(&itt);
            if !flag.load(Relaxed) {
                if done.status != sense::GOOD {
                    stats.errors.fetch_add(1, Relaxed);
                }
                let is_write = target.lu.data_out_len(&cdb).is_some();
                let n = done.data.len() as u64;
                if is_write {
                    stats.write_bytes.fetch_add(edtl as u64, Relaxed);
                } else {
                    stats.read_bytes.fetch_add(n, Relaxed);
                }
                let spdtl = target.lu.data_out_len(&cdb);
                let out = response(itt, lun, edtl, spdtl, done, &params, Some(held));
                let _ = tx.send(out).await;
            }
            drop(slot);
        });
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &mut self,
        itt: u32,
        lun: u64,
        cdb: &[u8; 16],
        edtl: u32,
        _w: bool,
        done: Done<B::Buf>,
        held: Option<Held>,
    ) {
        let spdtl = self.target.as_ref().and_then(|t| t.lu.data_out_len(cdb));
        let out = response(itt, lun, edtl, spdtl, done, &self.params, held);
        self.send(out).await;
    }
}

/// A command to a LUN other than 0: INQUIRY says no unit is there, REPORT LUNS works.
fn other_lun<Buf>(cdb: &[u8]) -> Done<Buf> {
    match cdb[0] {
        0x12 if cdb[1] & 1 == 0 => {
            let mut d = vec![0u8; 36];
            d[0] = 0x7f;
            d[2] = 0x06;
            d[3] = 0x12;
            d[4] = 31;
            let n = u16::from_be_bytes([cdb[3], cdb[4]]) as usize;
            d.truncate(n);
            Done::good(DataIn::Bytes(d))
        }
        0xa0 => {
            let mut d = vec![0u8; 16];
            d[3] = 8;
            let n = u32::from_be_bytes(cdb[6..10].try_into().unwrap()) as usize;
            d.truncate(n);
            Done::good(DataIn::Bytes(d))
        }
        _ => Done::check(sense::LUN_NOT_SUPPORTED),
    }
}

/// The PDUs answering a command: Data-In (the last with the status when it is GOOD), or a
/// SCSI Response. `spdtl`: the data-out a write command expects, for its residual.
fn response<Buf: AsRef<[u8]> + Send + 'static>(
    itt: u32,
    lun: u64,
    edtl: u32,
    spdtl: Option<u64>,
    done: Done<Buf>,
    p: &Params,
    held: Option<Held>,
) -> Out {
    let avail = done.data.len() as u64;
    let (expected, sent) = match spdtl {
        Some(w) => (w, 0),
        None => (avail, avail.min(edtl as u64)),
    };
    let (over, under, residual) = if expected > edtl as u64 {
        (
            true,
            false,
            (expected - edtl as u64).min(u32::MAX as u64) as u32,
        )
    } else if expected < edtl as u64 {
        (false, true, (edtl as u64 - expected) as u32)
    } else {
        (false, false, 0)
    };
    let res_flags = if over { 0x04 } else { 0 } | if under { 0x02 } else { 0 };
    let mut pdus = Vec::new();
    let sent = sent as usize;
    let mut data_sn = 0u32;
    let collapse = done.status == sense::GOOD && sent > 0;
    let seg = p.send_dsl.max(512);
    let mut off = 0usize;
    let mut burst = 0usize;
    while off < sent {
        let n = seg.min(sent - off);
        let last = off + n == sent;
        burst += n;
        let end_of_burst = last || burst + seg > p.max_burst as usize;
        let mut h = header(OP_DATA_IN, if end_of_burst { FLAG_F } else { 0 });
        h[8..16].copy_from_slice(&lun.to_be_bytes());
        put32(&mut h, 16, itt);
        put32(&mut h, 20, NO_TAG);
        put32(&mut h, 36, data_sn);
        put32(&mut h, 40, off as u32);
        let mut stat = Stat::None;
        if last && collapse {
            h[1] |= 0x01 | res_flags;
            h[3] = done.status;
            put32(&mut h, 44, residual);
            stat = Stat::Advance;
        }
        if end_of_burst {
            burst = 0;
        }
        pdus.push(OutPdu {
            bhs: h,
            data: off..off + n,
            stat,
        });
        data_sn += 1;
        off += n;
    }
    let mut data: Box<dyn AsRef<[u8]> + Send> = Box::new(DataBox(done.data));
    if !collapse {
        let mut h = header(OP_SCSI_RESP, FLAG_F | res_flags);
        h[3] = done.status;
        h[8..16].fill(0);
        put32(&mut h, 16, itt);
        put32(&mut h, 36, data_sn);
        put32(&mut h, 44, residual);
        let range = if done.sense.is_empty() {
            0..0
        } else {
            // The sense data follows the data already sent, in its own buffer.
            let mut s = Vec::with_capacity(2 + done.sense.len());
            s.extend_from_slice(&(done.sense.len() as u16).to_be_bytes());
            s.extend_from_slice(&done.sense);
            let base = (*data).as_ref().len();
            let joined: Vec<u8> = [(*data).as_ref(), &s].concat();
            data = Box::new(joined);
            base..base + s.len()
        };
        pdus.push(OutPdu {
            bhs: h,
            data: range,
            stat: Stat::Advance,
        });
    }
    Out {
        pdus,
        data: Some(data),
        _held: held,
        last: false,
    }
}

async fn writer(
    wr: BufWriter<OwnedWriteHalf>,
    mut rx: mpsc::Receiver<Out>,
    mut stat_sn: u32,
    exp_cmd_sn: Arc<AtomicU32>,
    p: Params,
    io_t: Duration,
) -> io::Result<()> {
    let mut wr = wr;
    let mut hdr = Vec::with_capacity(128);
    while let Some(o) = rx.recv().await {
        let data: &[u8] = o.data.as_ref().map(|d| (**d).as_ref()).unwrap_or(&[]);
        for op in &o.pdus {
            let mut bhs = op.bhs;
            if op.stat != Stat::None {
                put32(&mut bhs, 24, stat_sn);
            }
            if op.stat == Stat::Advance {
                stat_sn = stat_sn.wrapping_add(1);
            }
            let exp = exp_cmd_sn.load(Relaxed);
            put32(&mut bhs, 28, exp);
            put32(&mut bhs, 32, exp.wrapping_add(QUEUE_DEPTH - 1));
            let d = &data[op.data.clone()];
            hdr.clear();
            encode_header(bhs, d.len(), p.header_digest, &mut hdr);
            let w = async {
                wr.write_all(&hdr).await?;
                if !d.is_empty() {
                    wr.write_all(d).await?;
                    wr.write_all(&[0u8; 4][..pad4(d.len())]).await?;
                    if p.data_digest {
                        wr.write_all(&data_digest(d).to_le_bytes()).await?;
                    }
                }
                Ok::<_, io::Error>(())
            };
            timeout(io_t, w).await.map_err(|_| {
                io::Error::new(io::ErrorKind::TimedOut, "the initiator took no data")
            })??;
        }
        if o.last || rx.is_empty() {
            timeout(io_t, wr.flush()).await.map_err(|_| {
                io::Error::new(io::ErrorKind::TimedOut, "the initiator took no data")
            })??;
        }
        if o.last {
            let _ = wr.shutdown().await;
            return Ok(());
        }
    }
    let _ = wr.flush().await;
    Ok(())
}
