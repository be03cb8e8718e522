//! An in-memory member for property tests and fault injection. Completes inline.
//!
//! It behaves like a member file: [`MemDev::truncate`] shrinks it as `truncate -s` would,
//! after which reads past the new end come back short (an EOF error) and a write past it
//! extends the member, leaving a hole of zeros before the written bytes.

use super::{BlockDev, Done, IoKind, IoReq};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub struct MemDev {
    name: String,
    /// The size it was made with (what `size()` reports, as a file's size at open).
    size: u64,
    data: Mutex<Vec<u8>>,
    /// Fail every read/write with EIO while set (a dead member).
    pub dead: AtomicBool,
    /// Number of requests served, for tests that check who was asked.
    pub reads: AtomicU64,
    pub writes: AtomicU64,
}

impl MemDev {
    pub fn new(name: impl Into<String>, size: u64) -> MemDev {
        MemDev {
            name: name.into(),
            size,
            data: Mutex::new(vec![0u8; size as usize]),
            dead: AtomicBool::new(false),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }

    /// Direct access to the bytes (tests corrupt and inspect members through this).
    pub fn with_data<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        f(&mut self.data.lock())
    }

    /// Change the member's length as `truncate -s` changes a file's: shrinking drops the
    /// bytes past `len`, growing adds zeros.
    pub fn truncate(&self, len: u64) {
        self.data.lock().resize(len as usize, 0);
    }
}

impl BlockDev for MemDev {
    fn submit(&self, req: IoReq, done: Done) {
        if self.dead.load(Ordering::Acquire) {
            return done(Err(io::Error::from_raw_os_error(libc::EIO)));
        }
        let mut data = self.data.lock();
        let off = req.offset as usize;
        let r = match &req.kind {
            IoKind::Read { buf } => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                if off + buf.len() > data.len() {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "read past the end of the member",
                    ))
                } else {
                    // SAFETY: the engine owns this range for this I/O.
                    unsafe { buf.as_mut_slice() }.copy_from_slice(&data[off..off + buf.len()]);
                    Ok(())
                }
            }
            IoKind::Write { buf, .. } => {
                self.writes.fetch_add(1, Ordering::Relaxed);
                if off + buf.len() > data.len() {
                    // As a file does: the write extends it.
                    data.resize(off + buf.len(), 0);
                }
                // SAFETY: as above.
                data[off..off + buf.len()].copy_from_slice(unsafe { buf.as_slice() });
                Ok(())
            }
            IoKind::Flush => Ok(()),
            IoKind::Zero { len, .. } => {
                let end = (off + *len as usize).min(data.len());
                data[off.min(end)..end].fill(0);
                Ok(())
            }
        };
        drop(data);
        drop(req);
        done(r)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn current_size(&self) -> io::Result<u64> {
        Ok(self.data.lock().len() as u64)
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn zeroes_cheaply(&self) -> bool {
        true
    }

    /// As a sparse file would say: the 4 KiB blocks that hold a byte other than zero are
    /// data (a block of zeros reads back as zeros, the only promise a hole makes).
    fn data_ranges(&self, offset: u64, len: u64) -> Option<io::Result<Vec<(u64, u64)>>> {
        const B: u64 = 4096;
        let data = self.data.lock();
        let end = offset.saturating_add(len);
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut b = offset / B * B;
        while b < end {
            let (s, e) = (b.max(offset), (b + B).min(end));
            let lo = (s as usize).min(data.len());
            let hi = (e as usize).min(data.len());
            if data[lo..hi].iter().any(|&x| x != 0) {
                match out.last_mut() {
                    Some(last) if last.1 == s => last.1 = e,
                    _ => out.push((s, e)),
                }
            }
            b += B;
        }
        Some(Ok(out))
    }
}
