//! An in-memory export, for tests.

use crate::backend::{Backend, ExportInfo, Extent, NbdError};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

pub struct MemBackend {
    data: RwLock<Vec<u8>>,
    pub info: ExportInfo,
    /// The server's count of WRITEs received and not finished ([`Backend::queued_writes`]).
    pub queued: Arc<AtomicUsize>,
    /// The most that count read while a write was being done here.
    pub most_queued_seen: AtomicUsize,
}

impl MemBackend {
    pub fn new(size: u64) -> MemBackend {
        MemBackend {
            data: RwLock::new(vec![0u8; size as usize]),
            info: ExportInfo {
                size,
                min_block: 4096,
                preferred_block: 4096,
                max_payload: 32 << 20,
                read_only: false,
                can_flush: true,
                can_fua: true,
                can_trim: true,
                can_write_zeroes: true,
                can_multi_conn: true,
                description: Some("in-memory test export".into()),
            },
            queued: Default::default(),
            most_queued_seen: AtomicUsize::new(0),
        }
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().clone()
    }
}

impl Backend for MemBackend {
    type Buf = Vec<u8>;

    fn info(&self) -> ExportInfo {
        self.info.clone()
    }

    fn alloc(&self, len: usize) -> Vec<u8> {
        vec![0u8; len]
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, NbdError> {
        let d = self.data.read();
        Ok(d[offset as usize..offset as usize + len as usize].to_vec())
    }

    fn queued_writes(&self) -> Option<Arc<AtomicUsize>> {
        Some(self.queued.clone())
    }

    async fn write(&self, offset: u64, data: Vec<u8>, _fua: bool) -> Result<(), NbdError> {
        self.most_queued_seen
            .fetch_max(self.queued.load(Relaxed), Relaxed);
        self.data.write()[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        Ok(())
    }

    async fn flush(&self) -> Result<(), NbdError> {
        Ok(())
    }

    async fn trim(&self, offset: u64, len: u32, _fua: bool) -> Result<(), NbdError> {
        self.data.write()[offset as usize..offset as usize + len as usize].fill(0);
        Ok(())
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        _fua: bool,
        _no_hole: bool,
    ) -> Result<(), NbdError> {
        self.data.write()[offset as usize..offset as usize + len as usize].fill(0);
        Ok(())
    }

    // Byte-addressed memory: a write of any alignment is one copy under the lock.
    async fn write_unaligned(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), NbdError> {
        self.write(offset, data, fua).await
    }

    /// Blocks of zeros are holes (they read as zeros: all a hole promises), others data.
    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, NbdError> {
        const B: u64 = 4096;
        let d = self.data.read();
        let end = (offset + len).min(d.len() as u64);
        let mut out: Vec<Extent> = Vec::new();
        let mut at = offset;
        while at < end {
            let next = ((at / B + 1) * B).min(end);
            let zero = d[at as usize..next as usize].iter().all(|&b| b == 0);
            let x = if zero {
                Extent::hole(next - at)
            } else {
                Extent::data(next - at)
            };
            match out.last_mut() {
                Some(l) if l.flags == x.flags => l.length += x.length,
                _ => out.push(x),
            }
            at = next;
        }
        Ok(out)
    }

    fn fast_zero(&self, _offset: u64, _len: u64) -> bool {
        true
    }

    async fn write_zeroes_unaligned(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    ) -> Result<(), NbdError> {
        self.write_zeroes(offset, len, fua, no_hole).await
    }
}
