//! The bearer token that authorises actions: 32 random bytes as hex, in `web.token` in the
//! state directory, readable only by its owner (created with mode 0600 on first start).

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

pub fn token_path() -> PathBuf {
    sbod_mgmt::registry::state_dir().join("web.token")
}

/// The token, made now if there is none.
pub fn load_or_create() -> Result<String> {
    let p = token_path();
    match std::fs::read_to_string(&p) {
        Ok(t) => {
            let mode = std::fs::metadata(&p)?.permissions().mode();
            if mode & 0o077 != 0 {
                bail!(
                    "{} is readable by others (mode {:o}): chmod 600 it, or remove it to get a new token",
                    p.display(),
                    mode & 0o777
                );
            }
            let t = t.trim().to_string();
            if t.len() < 32 {
                bail!(
                    "{} holds no usable token: remove it to get a new one",
                    p.display()
                );
            }
            Ok(t)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(d) = p.parent() {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            }
            let mut raw = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut raw))
                .context("reading /dev/urandom")?;
            let t: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&p)
                .with_context(|| format!("creating {}", p.display()))?;
            writeln!(f, "{t}")?;
            Ok(t)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
    }
}

/// Compare in time independent of where the strings differ.
pub fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
