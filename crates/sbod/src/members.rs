//! Opening member paths as engine devices.

use anyhow::{bail, Context, Result};
use sbod_core::dev::{self, file, BlockDev};
use sbod_core::MemberSpec;
use std::path::Path;
use std::sync::Arc;

/// Open one member (exclusively, O_DIRECT where possible).
pub fn open(path: &str, domain: &str) -> Result<MemberSpec> {
    open_with(path, domain, &file::OpenOptions::default())
}

/// Open one member only to look at it (shared, read-only).
pub fn open_read_only(path: &str) -> Result<MemberSpec> {
    let opts = file::OpenOptions {
        read_only: true,
        exclusive: false,
        threads: 1,
        ..Default::default()
    };
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
        created.push(p.clone());
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

/// Check a path names something sbod can use before doing anything.
pub fn check_exists(p: &str) -> Result<()> {
    if !Path::new(p).exists() {
        bail!("{p} does not exist (give --size-each to create member files)");
    }
    Ok(())
}
