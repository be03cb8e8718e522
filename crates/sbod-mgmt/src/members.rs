//! Opening member paths as engine devices: files and block devices, NBD URIs for
//! members on other hosts (`nbd://HOST[:PORT]/EXPORT`, `nbds://`, `nbd+unix://`), or
//! modelled drives for the lab (`model:PROFILE[,OPTIONS]:PATH`, see `sbod_drive::spec`):
//! the file at PATH keeps the data and the drive's model times the answers.

use anyhow::{bail, Context, Result};
use sbod_core::dev::{self, file, BlockDev};
use sbod_core::MemberSpec;
use std::path::Path;
use std::sync::Arc;

/// Open one member (exclusively, O_DIRECT where possible). A remote member's failure
/// domain is its host unless `domain` says otherwise.
pub fn open(path: &str, domain: &str) -> Result<MemberSpec> {
    if sbod_remote::is_uri(path) {
        return open_remote(path, domain, false);
    }
    if sbod_drive::is_model(path) {
        return open_model(path, domain, &model_options(file::OpenOptions::default()));
    }
    if let Some(d) = drive_model() {
        // The lab's `sbod bench --drives`: this file member answers as a modelled drive,
        // under its own name.
        let mut spec = open_model(
            &format!("{}{d}:{path}", sbod_drive::spec::PREFIX),
            domain,
            &model_options(file::OpenOptions::default()),
        )?;
        spec.path = path.to_string();
        return Ok(spec);
    }
    open_with(path, domain, &file::OpenOptions::default())
}

/// The environment variable that makes this process open every local member (a file or
/// block device named plainly) as a modelled drive: `PROFILE[,OPTIONS]` as in
/// `model:PROFILE[,OPTIONS]:PATH`. Set by `sbod bench --drives` for its servers; read once.
pub const DRIVE_MODEL_ENV: &str = "SBOD_DRIVE_MODEL";

fn drive_model() -> Option<&'static str> {
    static V: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        std::env::var(DRIVE_MODEL_ENV)
            .ok()
            .filter(|v| !v.is_empty())
    })
    .as_deref()
}

/// The file behind a member name where there is one: a file or device path as given, the
/// data file of a modelled drive; None for a remote member.
pub fn local_path(p: &str) -> Option<&str> {
    if sbod_remote::is_uri(p) {
        None
    } else {
        Some(sbod_drive::spec::data_path(p))
    }
}

/// Does the member name a local path that exists, or a remote member (reached later)?
pub fn exists(p: &str) -> bool {
    local_path(p).is_none_or(|f| Path::new(f).exists())
}

/// A modelled drive's data file is read through the page cache: the model, not the disk
/// under the file, sets the time (O_DIRECT would add the host disk's own).
fn model_options(o: file::OpenOptions) -> file::OpenOptions {
    file::OpenOptions { direct: false, ..o }
}

fn open_model(name: &str, domain: &str, opts: &file::OpenOptions) -> Result<MemberSpec> {
    let spec = sbod_drive::Spec::parse(name).map_err(anyhow::Error::msg)?;
    let p = Path::new(&spec.path);
    let opened = file::open(p, opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    let is_file = !opened.block_device;
    let inner: Arc<dyn BlockDev> =
        dev::attach_member(spec.path.clone(), opened, opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    let dev = sbod_drive::wrap(name.to_string(), &spec, inner)
        .with_context(|| format!("{name}: the drive's links"))?;
    Ok(MemberSpec {
        dev,
        path: name.to_string(),
        is_file,
        domain: domain.to_string(),
    })
}

fn open_remote(uri: &str, domain: &str, read_only: bool) -> Result<MemberSpec> {
    let mut opts = sbod_remote::RemoteOptions::from_env()?;
    opts.read_only = read_only;
    let dev = sbod_remote::RemoteDev::open(uri, opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(MemberSpec {
        dev,
        path: uri.to_string(),
        is_file: false,
        domain: if domain.is_empty() {
            default_domain(uri)
        } else {
            domain.to_string()
        },
    })
}

/// The failure domain a member has unless told otherwise: a remote member's host (a host
/// is a failure domain, as in CRUSH); none for local devices.
pub fn default_domain(path: &str) -> String {
    sbod_nbd::NbdUri::parse(path)
        .ok()
        .and_then(|u| u.host().map(str::to_string))
        .unwrap_or_default()
}

/// The name a member is registered under: the absolute path of a file or device, or the
/// URI of a remote member written the one way.
pub fn canonical(p: &str) -> Result<String> {
    if sbod_remote::is_uri(p) {
        return Ok(sbod_nbd::NbdUri::parse(p)
            .map_err(anyhow::Error::msg)?
            .to_string());
    }
    if sbod_drive::is_model(p) {
        let spec = sbod_drive::Spec::parse(p).map_err(anyhow::Error::msg)?;
        let abs = crate::registry::absolute(Path::new(&spec.path))?;
        return Ok(spec.with_path(&abs));
    }
    crate::registry::absolute(Path::new(p))
}

/// Open one member only to look at it (shared, read-only).
pub fn open_read_only(path: &str) -> Result<MemberSpec> {
    let opts = file::OpenOptions {
        read_only: true,
        exclusive: false,
        threads: 1,
        ..Default::default()
    };
    if sbod_remote::is_uri(path) {
        return open_remote(path, "", true);
    }
    if sbod_drive::is_model(path) {
        return open_model(path, "", &model_options(opts));
    }
    open_with(path, "", &opts)
}

fn open_with(path: &str, domain: &str, opts: &file::OpenOptions) -> Result<MemberSpec> {
    let p = Path::new(path);
    let opened = file::open(p, opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    let is_file = !opened.block_device;
    let dev: Arc<dyn BlockDev> =
        dev::attach_member(path.to_string(), opened, opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(MemberSpec {
        dev,
        path: path.to_string(),
        is_file,
        domain: domain.to_string(),
    })
}

/// Create member files that don't exist yet at `size` bytes (sparse). Returns what was
/// created now (files, which read as zeros, and directories made for them); the caller
/// removes them with [`remove_created`] if what follows fails.
pub fn create_files(paths: &[String], size: u64) -> Result<Vec<String>> {
    let mut created = Vec::new();
    let r = create_each(paths, size, &mut created);
    if r.is_err() {
        // Nothing is left behind: the files made before the one that failed go too.
        remove_created(&created);
    }
    r.map(|()| created)
}

fn create_each(paths: &[String], size: u64, created: &mut Vec<String>) -> Result<()> {
    for p in paths {
        // Remote members exist on their host or not at all.
        let Some(p) = local_path(p) else {
            continue;
        };
        let path = Path::new(p);
        if path.exists() {
            continue;
        }
        if let Some(dir) = path.parent() {
            // Record each directory made, outermost first, so a failure removes them too.
            let mut missing: Vec<&Path> = dir
                .ancestors()
                .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
                .collect();
            missing.reverse();
            for d in missing {
                std::fs::create_dir(d).with_context(|| format!("creating {}", d.display()))?;
                created.push(d.display().to_string());
            }
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| format!("creating {p}"))?;
        created.push(p.to_string());
        f.set_len(size).with_context(|| format!("sizing {p}"))?;
    }
    Ok(())
}

/// Remove what `create_files` created (files, and the directories it made for them)
/// after a failed command.
pub fn remove_created(created: &[String]) {
    for p in created.iter().rev() {
        if std::fs::remove_file(p).is_err() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// Bytes at the start of a device that hold sbod's superblocks (both copies of a
/// member's, or a log device's): what [`save_heads`] keeps.
pub const HEAD: usize = 64 * 1024;

/// The first [`HEAD`] bytes of each local path that exists and is not in `skip` (files
/// made for this command), to put back with [`restore_heads`] if a create cannot finish:
/// a member that had no sbod superblock has none again, one that had another array's
/// (`--force`) has that one back. Remote members are not kept (they are reached through
/// the engine only).
pub fn save_heads(paths: &[String], skip: &[String]) -> Result<Vec<(String, Vec<u8>)>> {
    use std::io::Read;
    let mut out = Vec::new();
    for p in paths {
        let Some(p) = local_path(p) else {
            continue;
        };
        if skip.iter().any(|s| s == p) {
            continue;
        }
        let mut f = std::fs::File::open(p).with_context(|| format!("reading {p}"))?;
        let mut buf = Vec::with_capacity(HEAD);
        f.by_ref()
            .take(HEAD as u64)
            .read_to_end(&mut buf)
            .with_context(|| format!("reading {p}"))?;
        out.push((p.to_string(), buf));
    }
    Ok(out)
}

/// Put back what [`save_heads`] kept (after the array was closed). Returns what could not
/// be put back, in words.
pub fn restore_heads(heads: &[(String, Vec<u8>)]) -> Vec<String> {
    use std::os::unix::fs::FileExt;
    let mut bad = Vec::new();
    for (p, buf) in heads {
        let r = std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .and_then(|f| f.write_all_at(buf, 0).and_then(|()| f.sync_all()));
        if let Err(e) = r {
            bad.push(format!("{p}: {e}"));
        }
    }
    bad
}

/// Check a path names something sbod can use before doing anything.
pub fn check_exists(p: &str) -> Result<()> {
    if sbod_remote::is_uri(p) {
        // Parsed now; reached when opened.
        sbod_nbd::NbdUri::parse(p).map_err(anyhow::Error::msg)?;
        return Ok(());
    }
    if sbod_drive::is_model(p) {
        sbod_drive::Spec::parse(p).map_err(anyhow::Error::msg)?;
    }
    let name = p;
    let p = sbod_drive::spec::data_path(p);
    if !Path::new(p).exists() {
        if name != p {
            bail!("{p} (the data file of {name}) does not exist (give --size-each to create member files)");
        }
        bail!("{p} does not exist (give --size-each to create member files)");
    }
    Ok(())
}

/// What member files could still take from one file system: sparse (thin) member files
/// grow as the array writes them, and when their file system fills, writes fail with
/// ENOSPC (the array keeps serving and every member stays; the writes are refused).
#[derive(Debug)]
pub struct FsSpace {
    /// A path on the file system (the first member file on it), for messages.
    pub on: String,
    /// Bytes the member files there may still allocate, and bytes free there now.
    pub need: u64,
    pub free: u64,
    pub files: Vec<String>,
}

fn statvfs_free(p: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())?;
    // SAFETY: statvfs fills the zeroed struct we pass; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("free space of {}", p.display()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// The space member files may still take, per file system: existing regular files count
/// what they have not allocated yet; files to be made at `new_size` count all of it.
/// Block devices take nothing.
pub fn space_needed(paths: &[String], new_size: Option<u64>) -> Result<Vec<FsSpace>> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<(u64, FsSpace)> = Vec::new();
    for p in paths {
        let Some(p) = local_path(p) else {
            continue;
        };
        let path = Path::new(p);
        let (meta_of, need) = match std::fs::metadata(path) {
            Ok(m) if m.file_type().is_file() => {
                let allocated = m.blocks() * 512;
                (path.to_path_buf(), m.len().saturating_sub(allocated))
            }
            Ok(_) => continue,
            Err(_) => match new_size {
                // Not there yet: it will be made on the file system of its nearest
                // existing directory.
                Some(sz) => {
                    let dir = path
                        .ancestors()
                        .skip(1)
                        .find(|d| d.as_os_str().is_empty() || d.exists())
                        .map(|d| {
                            if d.as_os_str().is_empty() {
                                Path::new(".")
                            } else {
                                d
                            }
                        })
                        .unwrap_or(Path::new("."))
                        .to_path_buf();
                    (dir, sz)
                }
                None => continue,
            },
        };
        let dev = std::fs::metadata(&meta_of)
            .with_context(|| format!("{}", meta_of.display()))?
            .dev();
        match out.iter_mut().find(|(d, _)| *d == dev) {
            Some((_, fs)) => {
                fs.need += need;
                fs.files.push(p.to_string());
            }
            None => out.push((
                dev,
                FsSpace {
                    on: p.to_string(),
                    need,
                    free: statvfs_free(&meta_of)?,
                    files: vec![p.to_string()],
                },
            )),
        }
    }
    Ok(out.into_iter().map(|(_, f)| f).collect())
}

/// Say so where sparse member files cannot all grow to their size.
pub fn sparse_warnings(space: &[FsSpace]) -> Vec<String> {
    space
        .iter()
        .filter(|f| f.need > f.free)
        .map(|fs| {
            format!(
                "warning: {} member file(s) on the file system of {} are sparse and may still grow by {}, but only {} is free there: when it fills, writes fail with ENOSPC (no member is failed; writes resume once space is freed). Give them their space now with --preallocate, or free space.",
                fs.files.len(),
                fs.on,
                sbod_core::layout::human(fs.need),
                sbod_core::layout::human(fs.free)
            )
        })
        .collect()
}

/// `--preallocate`: refuse (before anything is made) where the file systems cannot hold
/// the member files fully allocated.
pub fn check_preallocate(space: &[FsSpace]) -> Result<()> {
    if let Some(fs) = space.iter().find(|f| f.need > f.free) {
        bail!(
            "--preallocate: the member files on the file system of {} need {} more, and only {} is free there: free space, or choose a smaller size or another place",
            fs.on,
            sbod_core::layout::human(fs.need),
            sbod_core::layout::human(fs.free)
        );
    }
    Ok(())
}

/// Allocate every block of the member files (fallocate; data they hold is kept).
pub fn preallocate(paths: &[String]) -> Result<()> {
    use std::os::unix::io::AsRawFd;
    for p in paths {
        let Some(p) = local_path(p) else {
            continue;
        };
        let path = Path::new(p);
        let meta = std::fs::metadata(path).with_context(|| p.to_string())?;
        if !meta.file_type().is_file() {
            continue;
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("opening {p}"))?;
        // SAFETY: plain syscall on an open fd.
        let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, meta.len() as libc::off_t) };
        if r != 0 {
            return Err(std::io::Error::from_raw_os_error(r)).with_context(|| {
                format!("allocating {p} ({})", sbod_core::layout::human(meta.len()))
            });
        }
    }
    Ok(())
}
