//! `sbod export`: the node side of remote members. Serves raw disks (block devices or
//! files) as named NBD exports: no RAID, O_DIRECT, FLUSH and FUA honoured, each disk with
//! its own queue. A head then uses them as `nbd://NODE/NAME` members.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use sbod_core::dev::{self, BlockDev, IoClass, IoKind, IoReq};
use sbod_core::superblock::Superblock;
use sbod_core::AlignedBuf;
use sbod_mgmt::registry as state;
use sbod_nbd::{Backend, ExportInfo, Extent, NbdError};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Disks or files to export: DEV (exported under its file name) or NAME=DEV.
    #[arg(required = true)]
    pub devices: Vec<String>,
    /// Where to listen: tcp:HOST:PORT or unix:PATH (repeatable).
    #[arg(long = "nbd", default_value = "tcp:127.0.0.1:10809")]
    pub listen: Vec<String>,
    /// Allow listening on addresses other than loopback.
    #[arg(long)]
    pub allow_remote: bool,
    /// Require TLS: the server's certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Export disks that hold a file system or other data, or belong to an array on this
    /// host.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub limits: crate::serve::NbdLimitArgs,
}

/// One disk as an export.
pub struct DiskExport {
    dev: Arc<dyn BlockDev>,
    size: u64,
    path: String,
    locks: RangeLocks,
    /// The disk's last health reading (smartctl), said in the export's description so a
    /// head shows it for its remote member (issue 28).
    health: parking_lot::Mutex<Option<sbod_types::Health>>,
}

/// How often `sbod export` reads its disks' health (smartd's default; `SBOD_HEALTH_TICK_MS`
/// for tests).
fn health_interval() -> std::time::Duration {
    std::env::var("SBOD_HEALTH_TICK_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis)
        .unwrap_or(std::time::Duration::from_secs(1800))
}

/// Read every exported disk's health (one thread each: smartctl is slow) and keep it.
fn read_health(exports: &[(String, Arc<DiskExport>)]) {
    let reader = sbod_health::Reader::from_env();
    let policy = sbod_types::HealthPolicy::default();
    std::thread::scope(|s| {
        for (_, e) in exports {
            let r = &reader;
            let p = &policy;
            s.spawn(move || {
                let h = r.health(&e.path, p);
                *e.health.lock() = Some(h);
            });
        }
    });
}

/// Region locks for the disk: a client that did not agree to 4 KiB blocks has its
/// partial blocks read, merged and written back, and that must not interleave with any
/// other write to the same blocks (multi-conn is advertised). Every write takes the
/// locks of the 1 MiB regions it touches, in order; 64 locks hashed by region keep
/// writes to different places apart (the SBOD rule: no lock shared by the whole disk).
/// Hand-written because it is a dozen lines over tokio's mutex.
struct RangeLocks {
    locks: Vec<tokio::sync::Mutex<()>>,
}

const LOCK_REGION: u64 = 1 << 20;

/// The class a request from the head goes to the disk with. NBD carries no priority, but
/// the head's heartbeat reads and writes exactly one block at a fixed place on every
/// member (its owner block): that one goes as urgent (`IoClass::Urgent`: ahead of the
/// disk's queue, with real-time I/O priority where the kernel grants it), as the head's
/// own local members send it, so a far member behind a deep queue does not let the
/// head's lease lapse. Anything else, on any disk, is plain.
fn class_of(offset: u64, len: u64) -> IoClass {
    if offset == sbod_core::superblock::OWNER_OFFSET && len == sbod_core::owner::BLOCK as u64 {
        IoClass::Urgent
    } else {
        IoClass::Foreground
    }
}

impl RangeLocks {
    fn new() -> Self {
        RangeLocks {
            locks: (0..64).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }

    async fn lock(&self, offset: u64, len: u64) -> Vec<tokio::sync::MutexGuard<'_, ()>> {
        let first = offset / LOCK_REGION;
        let last = (offset + len.max(1) - 1) / LOCK_REGION;
        let n = self.locks.len() as u64;
        let mut idx: Vec<usize> = (first..=last.min(first + n - 1))
            .map(|r| (r % n) as usize)
            .collect();
        idx.sort_unstable();
        idx.dedup();
        let mut guards = Vec::with_capacity(idx.len());
        for i in idx {
            guards.push(self.locks[i].lock().await);
        }
        guards
    }
}

fn io_err(e: std::io::Error) -> NbdError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => NbdError::NoSpc,
        Some(libc::EINVAL) => NbdError::Inval,
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::EROFS) => NbdError::Perm,
        _ => NbdError::Io,
    }
}

impl DiskExport {
    /// Read, merge and write back the 4 KiB blocks covering `[offset, offset+len)`,
    /// `merge` filling the new bytes; the caller holds the region locks.
    async fn merge_blocks(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        merge: impl FnOnce(&mut [u8]),
    ) -> Result<(), NbdError> {
        let start = offset / 4096 * 4096;
        let end = (offset + len).div_ceil(4096) * 4096;
        if end > self.size {
            return Err(NbdError::Inval);
        }
        let buf = AlignedBuf::for_overwrite((end - start) as usize).into_shared();
        self.io(IoReq {
            offset: start,
            kind: IoKind::Read { buf: buf.clone() },
            class: IoClass::Foreground,
        })
        .await?;
        let mut buf = buf.try_unwrap().expect("the read is over");
        let at = (offset - start) as usize;
        merge(&mut buf[at..at + len as usize]);
        self.io(IoReq {
            offset: start,
            kind: IoKind::Write {
                buf: buf.into_shared(),
                fua,
            },
            class: IoClass::Foreground,
        })
        .await
    }

    async fn io(&self, req: IoReq) -> Result<(), NbdError> {
        dev::io(&self.dev, req).await.map_err(|e| {
            tracing::warn!(disk = %self.path, error = %e, "I/O error");
            io_err(e)
        })
    }
}

impl Backend for DiskExport {
    type Buf = AlignedBuf;

    fn info(&self) -> ExportInfo {
        ExportInfo {
            size: self.size,
            // O_DIRECT: whole 4 KiB blocks (clients that did not agree get read-modify-write).
            min_block: 4096,
            preferred_block: 64 << 10,
            max_payload: 32 << 20,
            read_only: false,
            can_flush: true,
            can_fua: true,
            can_trim: true,
            can_write_zeroes: true,
            // FLUSH is an fdatasync of the disk: it covers writes from every connection.
            can_multi_conn: true,
            description: Some(sbod_health::export_description(
                &self.path,
                self.health.lock().as_ref(),
            )),
        }
    }

    fn alloc(&self, len: usize) -> AlignedBuf {
        AlignedBuf::for_overwrite(len)
    }

    async fn read(&self, offset: u64, len: u32) -> Result<AlignedBuf, NbdError> {
        let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
        self.io(IoReq {
            offset,
            kind: IoKind::Read { buf: buf.clone() },
            class: class_of(offset, len as u64),
        })
        .await?;
        Ok(buf.try_unwrap().expect("the read is over"))
    }

    async fn write(&self, offset: u64, data: AlignedBuf, fua: bool) -> Result<(), NbdError> {
        let _g = self.locks.lock(offset, data.len() as u64).await;
        let class = class_of(offset, data.len() as u64);
        self.io(IoReq {
            offset,
            kind: IoKind::Write {
                buf: data.into_shared(),
                fua,
            },
            class,
        })
        .await
    }

    async fn flush(&self) -> Result<(), NbdError> {
        self.io(IoReq {
            offset: 0,
            kind: IoKind::Flush,
            class: IoClass::Foreground,
        })
        .await
    }

    /// `base:allocation` of a file: its holes (a block device: all data).
    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, NbdError> {
        let dev = self.dev.clone();
        let len = len.min(1 << 30);
        let ranges = tokio::task::spawn_blocking(move || dev.data_ranges(offset, len))
            .await
            .map_err(|_| NbdError::Io)?;
        let Some(Ok(ranges)) = ranges else {
            return Ok(vec![Extent::data(len)]);
        };
        let mut out = Vec::with_capacity(2 * ranges.len() + 1);
        let mut pos = offset;
        for (s, e) in ranges {
            if s > pos {
                out.push(Extent::hole(s - pos));
            }
            out.push(Extent::data(e - s.max(pos)));
            pos = e;
        }
        if pos < offset + len {
            out.push(Extent::hole(offset + len - pos));
        }
        Ok(out)
    }

    fn fast_zero(&self, _offset: u64, _len: u64) -> bool {
        self.dev.zeroes_cheaply()
    }

    async fn trim(&self, offset: u64, len: u32, fua: bool) -> Result<(), NbdError> {
        // Zeroing with a hole is a valid trim, and leaves nothing stale behind.
        self.write_zeroes(offset, len, fua, false).await
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    ) -> Result<(), NbdError> {
        let g = self.locks.lock(offset, len as u64).await;
        self.io(IoReq {
            offset,
            kind: IoKind::Zero {
                len: len as u64,
                punch: !no_hole,
            },
            class: IoClass::Foreground,
        })
        .await?;
        drop(g);
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    async fn write_unaligned(
        &self,
        offset: u64,
        data: AlignedBuf,
        fua: bool,
    ) -> Result<(), NbdError> {
        let len = data.len() as u64;
        let _g = self.locks.lock(offset, len).await;
        self.merge_blocks(offset, len, fua, |b| b.copy_from_slice(&data))
            .await
    }

    async fn write_zeroes_unaligned(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        _no_hole: bool,
    ) -> Result<(), NbdError> {
        let _g = self.locks.lock(offset, len as u64).await;
        self.merge_blocks(offset, len as u64, fua, |b| b.fill(0))
            .await
    }
}

/// Split `NAME=DEV` or `DEV` (named after its file name).
fn name_and_path(arg: &str) -> Result<(String, String)> {
    let (name, path) = match arg.split_once('=') {
        Some((n, p)) if !n.contains('/') => (n.to_string(), p.to_string()),
        _ => {
            let name = std::path::Path::new(arg)
                .file_name()
                .ok_or_else(|| anyhow!("'{arg}' names no file; give NAME=DEV"))?
                .to_string_lossy()
                .to_string();
            (name, arg.to_string())
        }
    };
    if name.is_empty() || name.len() > 4096 {
        bail!("'{arg}': export names are 1 to 4096 bytes");
    }
    Ok((name, path))
}

/// Refuse a disk an array on this host uses, or one that holds something else, unless
/// forced. A disk holding a member of an array registered elsewhere (a remote head's) is
/// what `sbod export` is for, and is served.
async fn check_disk(dev: &Arc<dyn BlockDev>, path: &str, force: bool) -> Result<()> {
    let n = (sbod_core::signature::PROBE_BYTES as u64).min(dev.size() / 4096 * 4096) as usize;
    if n == 0 {
        bail!("{path} is smaller than 4 KiB");
    }
    let buf = AlignedBuf::zeroed(n).into_shared();
    dev::read_at(dev, 0, buf.clone(), IoClass::Foreground)
        .await
        .with_context(|| format!("reading {path}"))?;
    let buf = buf.try_unwrap().expect("the read is over");
    if let Ok(sb) = Superblock::decode_area(&buf) {
        let local = state::list()?
            .into_iter()
            .find(|n| state::load(n).is_ok_and(|r| r.uuid == sb.array_uuid.to_string()));
        match local {
            Some(n) if !force => bail!(
                "{path} is a member of '{n}', an array of this host; stop it and `sbod forget {n}` before exporting its disks, or use --force"
            ),
            Some(_) => {}
            None => eprintln!(
                "sbod: {path} holds a member of array '{}' ({}) of another head",
                sb.name, sb.array_uuid
            ),
        }
        return Ok(());
    }
    if let Some(what) = sbod_core::signature::probe(&buf) {
        if !force {
            bail!("{path} holds {what}; sbod will not export it without --force");
        }
    }
    Ok(())
}

pub async fn export(args: ExportArgs) -> Result<()> {
    let limits = args.limits.limits()?;
    let listeners = args
        .listen
        .iter()
        .map(|l| sbod_nbd::Listen::parse(l, args.allow_remote))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => Some(sbod_nbd::tls::server_config(c, k)?),
        _ => None,
    };
    let mut exports: Vec<(String, Arc<DiskExport>)> = Vec::new();
    let close_all = |exports: &[(String, Arc<DiskExport>)]| {
        for (_, e) in exports {
            e.dev.close();
        }
    };
    for a in &args.devices {
        let r = async {
            let (name, path) = name_and_path(a)?;
            if exports.iter().any(|(n, _)| *n == name) {
                bail!("two disks are exported as '{name}': name them with NAME=DEV");
            }
            if sbod_remote::is_uri(&path) {
                bail!("{path} is remote already: export disks of this host");
            }
            let abs = state::absolute(std::path::Path::new(&path))?;
            let dev = dev::open_member(std::path::Path::new(&abs), &Default::default())
                .map_err(|e| anyhow!("{e}"))?;
            if let Err(e) = check_disk(&dev, &abs, args.force).await {
                dev.close();
                return Err(e);
            }
            let size = dev.size() / 4096 * 4096;
            Ok((
                name,
                Arc::new(DiskExport {
                    locks: RangeLocks::new(),
                    dev,
                    size,
                    path: abs,
                    health: parking_lot::Mutex::new(None),
                }),
            ))
        }
        .await;
        match r {
            Ok(e) => exports.push(e),
            Err(e) => {
                close_all(&exports);
                return Err(e);
            }
        }
    }
    // The disks' health, read before the first client asks and then on a schedule.
    read_health(&exports);
    {
        let exports = exports.clone();
        std::thread::Builder::new()
            .name("sbod-export-health".into())
            .spawn(move || loop {
                std::thread::sleep(health_interval());
                read_health(&exports);
            })
            .ok();
    }
    for (n, e) in &exports {
        eprintln!(
            "sbod: exporting {} as '{n}' ({})",
            e.path,
            sbod_core::layout::human(e.size)
        );
    }
    eprintln!(
        "sbod: listening on {}{}",
        args.listen.join(", "),
        if tls.is_some() { " (TLS required)" } else { "" }
    );
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signal");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    let mut server = sbod_nbd::Server::new(exports.clone()).with_limits(limits);
    if let Some(cfg) = tls {
        server = server.with_tls(cfg);
    }
    let r = server.serve(listeners, shutdown).await;
    close_all(&exports);
    eprintln!("sbod: exports stopped");
    r.map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sbod_core::dev::Done;

    /// A disk that answers at once and remembers each request's class.
    struct Recording(parking_lot::Mutex<Vec<(u64, IoClass)>>);

    impl BlockDev for Recording {
        fn submit(&self, req: IoReq, done: Done) {
            self.0.lock().push((req.offset, req.class));
            done(Ok(()));
        }
        fn size(&self) -> u64 {
            1 << 20
        }
        fn name(&self) -> &str {
            "recording"
        }
    }

    #[test]
    fn the_heads_owner_block_goes_to_the_disk_as_urgent() {
        let rec = Arc::new(Recording(parking_lot::Mutex::new(Vec::new())));
        let e = DiskExport {
            dev: rec.clone(),
            size: 1 << 20,
            path: "d".into(),
            locks: RangeLocks::new(),
            health: parking_lot::Mutex::new(None),
        };
        let owner = sbod_core::superblock::OWNER_OFFSET;
        let block = sbod_core::owner::BLOCK;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            e.read(owner, block as u32).await.unwrap();
            e.write(owner, AlignedBuf::zeroed(block), true)
                .await
                .unwrap();
            // Data, and reads that only cover the owner block, stay plain.
            e.read(0, 64 << 10).await.unwrap();
            e.write(owner + 4096, AlignedBuf::zeroed(block), false)
                .await
                .unwrap();
            e.read(owner - 4096, 2 * block as u32).await.unwrap();
        });
        let got = rec.0.lock().clone();
        assert_eq!(
            got,
            vec![
                (owner, IoClass::Urgent),
                (owner, IoClass::Urgent),
                (0, IoClass::Foreground),
                (owner + 4096, IoClass::Foreground),
                (owner - 4096, IoClass::Foreground),
            ]
        );
    }
}
