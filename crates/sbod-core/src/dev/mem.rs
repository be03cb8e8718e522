//! An in-memory member for property tests and fault injection. Completes inline.

use super::{BlockDev, Done, IoKind, IoReq};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub struct MemDev {
    name: String,
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
                        "read past end",
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
                    Err(io::Error::new(io::ErrorKind::WriteZero, "write past end"))
                } else {
                    // SAFETY: as above.
                    data[off..off + buf.len()].copy_from_slice(unsafe { buf.as_slice() });
                    Ok(())
                }
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
        self.data.lock().len() as u64
    }

    fn name(&self) -> &str {
        &self.name
    }
}
