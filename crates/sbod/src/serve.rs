//! `sbod serve`: assemble a named array and serve it over NBD until SIGINT/SIGTERM or
//! `sbod stop`, with the control socket open for live management.

use crate::cmd;
use anyhow::{bail, Result};
use clap::Args;
use sbod_core::layout::Scheme;
use sbod_core::{AlignedBuf, Array, AssembleOptions};
use sbod_mgmt::metrics::{IoStats, Op};
use sbod_mgmt::{control, registry, Local};
use sbod_nbd::{Backend, ExportInfo, Extent, NbdError};
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The array to serve.
    pub name: String,
    /// Where to listen: unix:PATH or tcp:HOST:PORT (repeatable).
    #[arg(long = "nbd", default_value = "tcp:127.0.0.1:10809")]
    pub listen: Vec<String>,
    /// Allow listening on addresses other than loopback.
    #[arg(long)]
    pub allow_remote: bool,
    /// Start without members it had in service when it stopped (they are recorded as
    /// missing, and resynced from the write-intent bitmap when they come back).
    #[arg(long)]
    pub degraded: bool,
    /// Accept possible data loss: start although members are missing, over a split brain
    /// (taking the newest side) or a write hole; a failed array is served read-only to
    /// rescue what is readable; takes the members over from another host that holds them
    /// (that host is fenced).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub limits: NbdLimitArgs,
    #[command(flatten)]
    pub iscsi: IscsiArgs,
}

/// The iSCSI target (docs/ISCSI.md): the array as LUN 0 of one IQN.
#[derive(Args, Debug, Clone)]
pub struct IscsiArgs {
    /// Also serve the array over iSCSI on HOST:PORT (repeatable; 3260 is iSCSI's port).
    /// Loopback only unless --allow-remote.
    #[arg(
        long = "iscsi",
        value_name = "HOST:PORT",
        env = "SBOD_ISCSI",
        value_delimiter = ','
    )]
    pub iscsi: Vec<String>,
    /// The target's name (default iqn.2025-01.io.sbod:NAME).
    #[arg(long, value_name = "IQN")]
    pub iscsi_iqn: Option<String>,
    /// Only these initiators may log in (repeatable; default: any).
    #[arg(long = "iscsi-initiator", value_name = "IQN")]
    pub iscsi_initiators: Vec<String>,
    /// The logical block size initiators see: 512 (emulated on the array's 4 KiB, what
    /// ESXi and most tools expect) or 4096.
    #[arg(long, default_value_t = 512, value_name = "BYTES",
          value_parser = block_size_arg)]
    pub iscsi_block_size: u32,
}

fn block_size_arg(s: &str) -> Result<u32, String> {
    match s.trim() {
        "512" => Ok(512),
        "4096" | "4k" | "4K" => Ok(4096),
        _ => Err(format!("'{s}': the iSCSI block size is 512 or 4096")),
    }
}

/// CHAP secrets for an array's target, from `STATE/iscsi/NAME.chap` (mode 0600): lines
/// `user=`, `secret=` (what initiators must prove) and, for mutual CHAP, `target_user=` and
/// `target_secret=` (what the target proves back). No file: no CHAP.
pub fn load_chap(name: &str) -> Result<Option<sbod_iscsi::Chap>> {
    use std::os::unix::fs::PermissionsExt;
    let p = registry::state_dir()
        .join("iscsi")
        .join(format!("{name}.chap"));
    let meta = match std::fs::metadata(&p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!("reading {}: {e}", p.display()),
    };
    if meta.permissions().mode() & 0o077 != 0 {
        bail!(
            "{} holds CHAP secrets but others may read it: chmod 600 {}",
            p.display(),
            p.display()
        );
    }
    let text =
        std::fs::read_to_string(&p).map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))?;
    let mut kv = std::collections::HashMap::new();
    for l in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let Some((k, v)) = l.split_once('=') else {
            bail!("{}: '{l}' is not key=value", p.display());
        };
        kv.insert(k.trim().to_string(), v.trim().to_string());
    }
    let get = |k: &str| kv.get(k).cloned();
    let (Some(user), Some(secret)) = (get("user"), get("secret")) else {
        bail!("{}: needs user= and secret=", p.display());
    };
    // RFC 7143 12.1.3: at least 12 bytes of secret (16 recommended).
    if secret.len() < 12 || secret.len() > 255 {
        bail!("{}: the secret must be 12 to 255 bytes", p.display());
    }
    let mutual = match (get("target_user"), get("target_secret")) {
        (Some(u), Some(s)) => {
            if s.len() < 12 || s.len() > 255 || s == secret {
                bail!(
                    "{}: target_secret must be 12 to 255 bytes and differ from secret",
                    p.display()
                );
            }
            Some((u, s.into_bytes()))
        }
        (None, None) => None,
        _ => bail!(
            "{}: mutual CHAP needs both target_user= and target_secret=",
            p.display()
        ),
    };
    Ok(Some(sbod_iscsi::Chap {
        user,
        secret: secret.into_bytes(),
        mutual,
    }))
}

/// What keeps NBD clients from exhausting the server (docs/RELIABILITY.md, "Hostile
/// input"), for `sbod serve` and `sbod export`; each also read from its environment
/// variable (e.g. in a systemd drop-in).
#[derive(Args, Debug, Clone)]
pub struct NbdLimitArgs {
    /// Bytes of request payload all NBD connections together may hold in memory; a request
    /// waits for its share (at least 32M: the largest request).
    #[arg(long, env = "SBOD_NBD_INFLIGHT", default_value = "512M", value_parser = crate::cmd::size_arg, value_name = "SIZE")]
    pub nbd_inflight: u64,
    /// NBD connections at once; more are refused with the reason.
    #[arg(long, env = "SBOD_NBD_MAX_CONNECTIONS", default_value_t = 512, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub nbd_max_connections: u32,
    /// NBD connections at once from one IP address (TCP).
    #[arg(long, env = "SBOD_NBD_MAX_PER_CLIENT", default_value_t = 128, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub nbd_max_per_client: u32,
    /// Seconds a client has to finish the NBD handshake.
    #[arg(long, env = "SBOD_NBD_HANDSHAKE_TIMEOUT", default_value_t = 30.0, value_name = "SECS", value_parser = secs_arg)]
    pub nbd_handshake_timeout: f64,
    /// Seconds a started request's header and write payload have to arrive, and a batch
    /// of replies has to be taken by the client.
    #[arg(long, env = "SBOD_NBD_IO_TIMEOUT", default_value_t = 60.0, value_name = "SECS", value_parser = secs_arg)]
    pub nbd_io_timeout: f64,
    /// Seconds after which a connection with nothing in flight that sends nothing is
    /// closed; 0 (the default): never (the kernel's client may sit idle for long).
    #[arg(long, env = "SBOD_NBD_IDLE_TIMEOUT", default_value_t = 0.0, value_name = "SECS", value_parser = secs_arg)]
    pub nbd_idle_timeout: f64,
}

pub(crate) fn secs_arg(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=1e9).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a number of seconds (e.g. 30 or 0.5)")),
    }
}

impl NbdLimitArgs {
    pub fn limits(&self) -> Result<sbod_nbd::server::Limits> {
        if self.nbd_inflight < 32 << 20 {
            bail!(
                "--nbd-inflight {}: at least 32M, the largest request a client may send",
                sbod_types::size::format_size(self.nbd_inflight)
            );
        }
        let secs = |v: f64, flag: &str| -> Result<std::time::Duration> {
            if v <= 0.0 {
                bail!("{flag} must be more than 0 seconds");
            }
            Ok(std::time::Duration::from_secs_f64(v))
        };
        Ok(sbod_nbd::server::Limits {
            inflight_bytes: self.nbd_inflight,
            max_connections: self.nbd_max_connections as usize,
            max_per_client: self.nbd_max_per_client as usize,
            handshake_timeout: secs(self.nbd_handshake_timeout, "--nbd-handshake-timeout")?,
            io_timeout: secs(self.nbd_io_timeout, "--nbd-io-timeout")?,
            idle_timeout: (self.nbd_idle_timeout > 0.0)
                .then(|| std::time::Duration::from_secs_f64(self.nbd_idle_timeout)),
        })
    }
}

/// The array as an NBD export, counting client I/O (per-thread shards: no shared lock).
pub struct ArrayExport {
    pub array: Arc<Array>,
    pub io: Arc<IoStats>,
}

impl ArrayExport {
    /// Count a request that started at `t0`.
    fn count<T>(
        &self,
        op: Op,
        bytes: u64,
        t0: Instant,
        r: Result<T, NbdError>,
    ) -> Result<T, NbdError> {
        self.io.record(op, bytes, t0.elapsed(), r.is_ok());
        r
    }
}

fn nbd_err(e: sbod_core::Error) -> NbdError {
    match e {
        sbod_core::Error::Invalid(_) => NbdError::Inval,
        sbod_core::Error::ShutDown => NbdError::ShutDown,
        sbod_core::Error::ReadOnly(_) => NbdError::Perm,
        // ENOSPC to the client: its write did not complete, nothing else is wrong.
        sbod_core::Error::NoSpace(msg) => {
            tracing::debug!("{msg}");
            NbdError::NoSpc
        }
        // EIO tells the client nothing: the server's log says what failed (at most one
        // line a second, with how many more failed since: a failed array answering a
        // flood of requests must not flood the log).
        e => {
            if let Some(more) = EIO_LOG.allow() {
                if more > 0 {
                    tracing::warn!(
                        "request failed: {e} ({more} more failed since the last such line)"
                    );
                } else {
                    tracing::warn!("request failed: {e}");
                }
            }
            NbdError::Io
        }
    }
}

/// At most one log line a second for requests that failed with EIO.
static EIO_LOG: LogRate = LogRate::new();

/// A log line at most once a second, counting what it held back.
struct LogRate {
    /// The second (since the process's start) of the last line, plus one (0: none yet).
    last: std::sync::atomic::AtomicU64,
    held: std::sync::atomic::AtomicU64,
}

impl LogRate {
    const fn new() -> LogRate {
        LogRate {
            last: std::sync::atomic::AtomicU64::new(0),
            held: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Some(lines held back since the last one) if a line may go out now.
    fn allow(&self) -> Option<u64> {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        self.allow_at(
            START
                .get_or_init(std::time::Instant::now)
                .elapsed()
                .as_secs(),
        )
    }

    /// [`LogRate::allow`] at second `sec`.
    fn allow_at(&self, sec: u64) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let now = sec + 1;
        let last = self.last.load(Relaxed);
        if last != now
            && self
                .last
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            return Some(self.held.swap(0, Relaxed));
        }
        self.held.fetch_add(1, Relaxed);
        None
    }
}

impl Backend for ArrayExport {
    type Buf = AlignedBuf;

    fn info(&self) -> ExportInfo {
        let g = &self.array.geometry();
        // Full-stripe writes are cheapest; NBD wants a power of two.
        let preferred = match g.scheme() {
            Scheme::Parity { m, .. } if m > 0 && g.stripe_data().is_power_of_two() => {
                g.stripe_data()
            }
            _ => g.chunk as u64,
        }
        .min(32 << 20) as u32;
        ExportInfo {
            size: self.array.size(),
            min_block: 4096,
            preferred_block: preferred.max(4096),
            max_payload: 32 << 20,
            read_only: self.array.is_read_only(),
            can_flush: true,
            can_fua: true,
            can_trim: true,
            can_write_zeroes: true,
            // FLUSH is an fdatasync of every member: it covers writes from every connection.
            can_multi_conn: true,
            description: Some(format!("sbod {} {}", self.array.name(), g.level)),
        }
    }

    fn alloc(&self, len: usize) -> AlignedBuf {
        // The server fills every byte from the socket.
        AlignedBuf::for_overwrite(len)
    }

    fn queued_writes(&self) -> Option<Arc<std::sync::atomic::AtomicUsize>> {
        Some(self.array.queued_writes())
    }

    async fn read(&self, offset: u64, len: u32) -> Result<AlignedBuf, NbdError> {
        let t0 = Instant::now();
        // Plugged: the member I/Os of all the request's stripes reach each member's queue
        // together and go as one I/O per member where they are neighbours.
        let r = sbod_core::dev::plugged(self.array.read(offset, len as usize))
            .await
            .map_err(nbd_err);
        self.count(Op::Read, len as u64, t0, r)
    }

    async fn write(&self, offset: u64, data: AlignedBuf, fua: bool) -> Result<(), NbdError> {
        let t0 = Instant::now();
        let len = data.len() as u64;
        let r = sbod_core::dev::plugged(self.array.write(offset, data, fua))
            .await
            .map_err(nbd_err);
        self.count(Op::Write, len, t0, r)
    }

    async fn flush(&self) -> Result<(), NbdError> {
        let t0 = Instant::now();
        // As the sync mode says (`disabled`: acknowledged at once).
        let r = self.array.client_flush().await.map_err(nbd_err);
        self.count(Op::Flush, 0, t0, r)
    }

    async fn trim(&self, offset: u64, len: u32, fua: bool) -> Result<(), NbdError> {
        let t0 = Instant::now();
        let r = async {
            self.array.trim(offset, len as u64).await.map_err(nbd_err)?;
            if fua {
                self.array.client_flush().await.map_err(nbd_err)?;
            }
            Ok(())
        }
        .await;
        self.count(Op::Trim, len as u64, t0, r)
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    ) -> Result<(), NbdError> {
        let t0 = Instant::now();
        let r = self
            .array
            .write_zeroes(offset, len as u64, fua, !no_hole)
            .await
            .map_err(nbd_err);
        self.count(Op::Trim, len as u64, t0, r)
    }

    /// `base:allocation` from the members (`Array::allocation`): holes where every member
    /// row that could serve a read is a hole of its file; data everywhere else.
    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, NbdError> {
        let r = self.array.allocation(offset, len).await.map_err(nbd_err)?;
        Ok(r.into_iter()
            .map(|(n, zero)| match zero {
                true => Extent::hole(n),
                false => Extent::data(n),
            })
            .collect())
    }

    fn fast_zero(&self, offset: u64, len: u64) -> bool {
        self.array.zero_is_fast(offset, len)
    }

    // Partial blocks are merged by the engine inside the stripe lock every write to them
    // takes: no connection can lose another's bytes, so multi-conn stays true.
    async fn write_unaligned(
        &self,
        offset: u64,
        data: AlignedBuf,
        fua: bool,
    ) -> Result<(), NbdError> {
        self.array
            .write_bytes(offset, &data, fua)
            .await
            .map_err(nbd_err)
    }

    async fn write_zeroes_unaligned(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    ) -> Result<(), NbdError> {
        self.array
            .write_zeroes_bytes(offset, len as u64, fua, !no_hole)
            .await
            .map_err(nbd_err)
    }
}

pub async fn serve(args: ServeArgs) -> Result<()> {
    registry::check_name(&args.name)?;
    let limits = args.limits.limits()?;
    if control::running(&args.name).await {
        bail!("'{}' is already being served", args.name);
    }
    let listeners = args
        .listen
        .iter()
        .map(|l| sbod_nbd::Listen::parse(l, args.allow_remote))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let iscsi_listen = args
        .iscsi
        .iscsi
        .iter()
        .map(|l| sbod_iscsi::parse_listen(l, args.allow_remote))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let chap = if iscsi_listen.is_empty() {
        None
    } else {
        load_chap(&args.name)?
    };
    let registered = registry::load(&args.name)
        .map(|r| r.members)
        .unwrap_or_default();
    // Room for the registration before the members are opened (a start writes their
    // superblocks): a full or read-only state directory changes nothing.
    registry::load(&args.name)?;
    let room = registry::reserve(&args.name)?;
    let opened = cmd::manager()
        .open_offline(
            &args.name,
            AssembleOptions {
                degraded: args.degraded,
                force: args.force,
                ..Default::default()
            },
        )
        .await?;
    let array = opened.array.clone();
    if !array.is_read_only() {
        if let Err(e) = room.commit(&registry::of_array(&array, Some(&args.name))) {
            array.close().await.ok();
            return Err(e.context(format!(
                "'{}' was not served (stopped again cleanly)",
                args.name
            )));
        }
    }
    let io = Arc::new(IoStats::default());
    let on_stop = Arc::new(tokio::sync::Notify::new());
    let local = Arc::new(Local {
        io: Some(io.clone()),
        on_stop: Some(on_stop.clone()),
        ..opened
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Members' disks: health on the policy's schedule, fault LEDs, proactive replacement
    // onto a hot spare, hot-plug (issue 28).
    let health = tokio::spawn(sbod_mgmt::health::watch(local.clone(), stop_rx.clone()));
    let sock = registry::socket_path(&args.name);
    // The control socket answers until the array is closed: `sbod stop` waits for it to
    // go, so that what it reports as stopped is closed cleanly (a process killed after it
    // returns must not leave the array to be started as after a crash).
    let (ctl_stop_tx, ctl_stop_rx) = tokio::sync::watch::channel(false);
    let ctl = {
        let sock = sock.clone();
        tokio::spawn(async move { control::serve(local, &sock, ctl_stop_rx).await })
    };
    let missing: Vec<String> = {
        let open: Vec<String> = array
            .state()
            .live_members()
            .iter()
            .map(|m| m.path.clone())
            .collect();
        registered
            .into_iter()
            .filter(|p| sbod_remote::is_uri(p) && !open.contains(p))
            .collect()
    };
    let watcher = tokio::spawn(sbod_mgmt::rejoin::watch(
        array.clone(),
        missing,
        stop_rx.clone(),
    ));
    let st = array.status();
    eprintln!(
        "sbod: serving {} ({}, {}, {}) on {}",
        args.name,
        st.level,
        sbod_core::layout::human(st.size),
        st.state,
        args.listen.join(", ")
    );
    let shutdown = {
        let on_stop = on_stop.clone();
        let array = array.clone();
        async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("signal");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
                _ = on_stop.notified() => {}
            }
            // From here `sbod stop` is told how far the stop is (the servers' last
            // flush, then the close).
            array.stopping();
        }
    };
    let export = Arc::new(ArrayExport {
        array: array.clone(),
        io,
    });
    let server =
        sbod_nbd::Server::new(vec![(args.name.clone(), export.clone())]).with_limits(limits);
    let r = if iscsi_listen.is_empty() {
        server.serve(listeners, shutdown).await
    } else {
        let iqn = args
            .iscsi
            .iscsi_iqn
            .clone()
            .unwrap_or_else(|| sbod_iscsi::default_iqn(&args.name));
        let lu = Arc::new(sbod_iscsi::Lu::new(
            export,
            sbod_iscsi::LuConfig {
                block_size: args.iscsi.iscsi_block_size,
                serial: array.uuid.simple().to_string(),
                vendor: "SBOD".into(),
                product: format!("sbod {}", st.level),
            },
            &iqn,
        ));
        let target = sbod_iscsi::Target {
            iqn: iqn.clone(),
            alias: Some(args.name.clone()),
            lu,
            chap,
            initiators: args.iscsi.iscsi_initiators.clone(),
        };
        let (tx, rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let bound = sbod_iscsi::Server::new(vec![target])
            .bind(&iscsi_listen)
            .await?;
        eprintln!(
            "sbod: iSCSI target {iqn} (LUN 0) on {}",
            iscsi_listen
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let nbd = server.serve(listeners, stopped(rx.clone()));
        let iscsi = bound.serve(stopped(rx));
        let signal = async move {
            shutdown.await;
            let _ = tx.send(true);
        };
        let (r, ri, ()) = tokio::join!(nbd, iscsi, signal);
        r.and(ri)
    };
    let _ = stop_tx.send(true);
    let _ = watcher.await;
    let _ = health.await;
    // The registration is brought up to date; if it cannot be, the array is still
    // closed cleanly (its members are the truth), and the next start records it.
    if !array.is_read_only() {
        if let Err(e) = registry::save_array(&array, Some(&args.name)) {
            eprintln!(
                "sbod: warning: {}: the registration was not brought up to date ({}); the next start does it",
                args.name,
                sbod_mgmt::words::message(&e, sbod_mgmt::words::Style::Cli)
            );
        }
    }
    let closed = array.close().await;
    let _ = ctl_stop_tx.send(true);
    let _ = ctl.await;
    let _ = std::fs::remove_file(&sock);
    eprintln!("sbod: {} stopped", args.name);
    r?;
    closed?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood of failed requests logs one line, then counts the rest until the next
    /// second's line says how many.
    #[test]
    fn failed_requests_log_at_most_a_line_a_second() {
        let r = LogRate::new();
        assert_eq!(r.allow_at(7), Some(0));
        for _ in 0..1000 {
            assert_eq!(r.allow_at(7), None);
        }
        assert_eq!(r.allow_at(8), Some(1000));
        assert_eq!(r.allow_at(8), None);
        assert_eq!(r.allow_at(9), Some(1));
    }

    /// Each engine error reaches the NBD client as the errno its cause deserves: a codec
    /// failure is the engine's fault (EIO), never the request's (EINVAL).
    #[test]
    fn engine_errors_map_to_errnos() {
        use sbod_core::Error;
        let cases = [
            (Error::Codec("bad shard length".into()), NbdError::Io),
            (Error::Invalid("out of range".into()), NbdError::Inval),
            (Error::NoSpace("full".into()), NbdError::NoSpc),
            (Error::ReadOnly("rescue".into()), NbdError::Perm),
            (Error::Failed("gone".into()), NbdError::Io),
            (Error::ShutDown, NbdError::ShutDown),
        ];
        for (e, want) in cases {
            let what = e.to_string();
            assert_eq!(nbd_err(e), want, "{what}");
        }
    }
}
