//! Shared paths: an HBA port or an expander's uplink, a bandwidth ceiling that every drive
//! behind it draws from (the field's JBOD-versus-SBOD reports hinge on it).
//!
//! A link is a virtual-time ceiling: each transfer reserves `bytes / rate` of the link's
//! time, starting no earlier than it may and no earlier than the link is free. One word
//! per direction (SAS and PCIe links are full duplex), advanced with compare-and-swap: no
//! lock, and the word can live in a file mapped by every process that models a drive
//! behind the link (the lab's BASELINE serves each member from its own process). Times are
//! CLOCK_MONOTONIC nanoseconds, the same in every process of the machine.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Direction of a transfer on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Drive to host (reads).
    Up = 0,
    /// Host to drive (writes).
    Down = 1,
}

enum Words {
    Local(Box<[AtomicU64; 2]>),
    Mapped(Mapped),
}

struct Mapped {
    ptr: *mut AtomicU64,
}

// SAFETY: the mapping is shared memory holding two AtomicU64, used only through atomics,
// and unmapped only when the last reference goes.
unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: mapped in `Link::shared` with this length.
        unsafe { libc::munmap(self.ptr.cast(), 16) };
    }
}

/// A bandwidth ceiling shared by the drives on one path.
pub struct Link {
    pub name: String,
    /// Bytes per second, each direction.
    pub rate: f64,
    words: Words,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Link({}, {} MB/s)", self.name, self.rate / 1e6)
    }
}

impl Link {
    /// A link in this process only (tests, a drive's own interface).
    pub fn local(name: impl Into<String>, rate_bytes_per_sec: f64) -> Arc<Link> {
        Arc::new(Link {
            name: name.into(),
            rate: rate_bytes_per_sec,
            words: Words::Local(Box::new([AtomicU64::new(0), AtomicU64::new(0)])),
        })
    }

    /// A link whose state lives in `file` (created if missing), shared by every process
    /// that opens the same file.
    pub fn shared(name: &str, rate_bytes_per_sec: f64, file: &Path) -> io::Result<Arc<Link>> {
        use std::os::unix::io::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(file)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
        if f.metadata()?.len() < 16 {
            f.set_len(16)?;
        }
        // SAFETY: a shared mapping of 16 bytes of an open file; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                16,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Arc::new(Link {
            name: name.to_string(),
            rate: rate_bytes_per_sec,
            words: Words::Mapped(Mapped { ptr: p.cast() }),
        }))
    }

    fn word(&self, d: Dir) -> &AtomicU64 {
        match &self.words {
            Words::Local(w) => &w[d as usize],
            // SAFETY: the mapping holds two aligned u64 (page aligned) for as long as self.
            Words::Mapped(m) => unsafe { &*m.ptr.add(d as usize) },
        }
    }

    /// Nanoseconds `bytes` take on this link.
    pub fn cost(&self, bytes: u64) -> u64 {
        (bytes as f64 * 1e9 / self.rate) as u64
    }

    /// Reserve `bytes` in direction `d`, starting no earlier than `earliest`: returns when
    /// the transfer ends.
    pub fn reserve(&self, d: Dir, earliest: u64, bytes: u64) -> u64 {
        let cost = self.cost(bytes);
        let w = self.word(d);
        let mut cur = w.load(Ordering::Relaxed);
        loop {
            let end = cur.max(earliest) + cost;
            match w.compare_exchange_weak(cur, end, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return end,
                Err(now) => cur = now,
            }
        }
    }
}

/// Reserve a transfer on each link of a path; it ends when the slowest does.
pub fn reserve_path(links: &[Arc<Link>], d: Dir, earliest: u64, bytes: u64) -> u64 {
    links
        .iter()
        .map(|l| l.reserve(d, earliest, bytes))
        .max()
        .unwrap_or(earliest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_a_ceiling_shared_by_its_users() {
        // 100 MB/s: 1 MB takes 10 ms.
        let l = Link::local("exp", 100e6);
        assert_eq!(l.reserve(Dir::Up, 0, 1_000_000), 10_000_000);
        // A second transfer asked for at the same time waits for the first.
        assert_eq!(l.reserve(Dir::Up, 0, 1_000_000), 20_000_000);
        // The other direction is free (full duplex).
        assert_eq!(l.reserve(Dir::Down, 0, 1_000_000), 10_000_000);
        // Idle time is not banked: a transfer after a pause starts when asked.
        assert_eq!(l.reserve(Dir::Up, 1_000_000_000, 1_000_000), 1_010_000_000);
    }

    #[test]
    fn a_shared_link_is_the_same_ceiling_in_every_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("link");
        let a = Link::shared("e", 100e6, &f).unwrap();
        let b = Link::shared("e", 100e6, &f).unwrap();
        assert_eq!(a.reserve(Dir::Down, 0, 1_000_000), 10_000_000);
        assert_eq!(b.reserve(Dir::Down, 0, 1_000_000), 20_000_000);
    }
}
