//! Opening member paths as engine devices: files and block devices, or NBD URIs for
//! members on other hosts (`nbd://HOST[:PORT]/EXPORT`, `nbds://`, `nbd+unix://`).

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
    open_with(path, domain, &file::OpenOptions::default())
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
    crate::state::absolute(Path::new(p))
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

/// Create member files that don't exist yet at `size` bytes (sparse). Returns the files
/// created now (they read as zeros); the caller removes them if what follows fails.
pub fn create_files(paths: &[String], size: u64) -> Result<Vec<String>> {
    let mut created = Vec::new();
    for p in paths {
        let path = Path::new(p);
        // Remote members exist on their host or not at all.
        if sbod_remote::is_uri(p) || path.exists() {
            continue;
        }
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| format!("creating {p}"))?;
        f.set_len(size).with_context(|| format!("sizing {p}"))?;
        created.push(p.clone());
    }
    Ok(created)
}

/// Remove files created by `create_files` after a failed command.
pub fn remove_created(created: &[String]) {
    for p in created {
        let _ = std::fs::remove_file(p);
    }
}

/// Check a path names something sbod can use before doing anything.
pub fn check_exists(p: &str) -> Result<()> {
    if sbod_remote::is_uri(p) {
        // Parsed now; reached when opened.
        sbod_nbd::NbdUri::parse(p).map_err(anyhow::Error::msg)?;
        return Ok(());
    }
    if !Path::new(p).exists() {
        bail!("{p} does not exist (give --size-each to create member files)");
    }
    Ok(())
}
