//! Page-aligned I/O buffers.
//!
//! O_DIRECT needs buffers aligned to the device's logical block (4096 covers every device
//! sbod accepts). [`AlignedBuf`] owns such memory. [`SharedBuf`] lets several member I/Os
//! fill or drain disjoint parts of one buffer at once (a stripe read lands straight in the
//! client's buffer, no copy); each in-flight I/O holds a reference, so the memory outlives
//! the kernel's use of it even if the request that started it is dropped.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut, Range};
use std::ptr::NonNull;
use std::sync::Arc;

/// The alignment of every buffer (and the engine's logical block size).
pub const ALIGN: usize = 4096;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    /// Came from the pool (holds old, initialised bytes).
    recycled: bool,
}

// SAFETY: AlignedBuf owns its allocation like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of `len` bytes (capacity rounded up to ALIGN).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let mut b = AlignedBuf::for_overwrite(len);
        if b.recycled {
            b.fill(0);
            b.recycled = false;
        }
        b
    }

    /// A buffer whose contents the caller will overwrite entirely (a read target, a
    /// network payload): it may come from the pool holding old bytes, which saves zeroing
    /// and, for large buffers, the page faults of fresh memory on every request.
    pub fn for_overwrite(len: usize) -> AlignedBuf {
        let mut cap = len.div_ceil(ALIGN).max(1) * ALIGN;
        if cap <= 32 << 20 {
            // Power-of-two capacities can be pooled and reused by any size in the class.
            cap = cap.next_power_of_two();
        }
        if let Some((ptr, cap)) = pool::take(cap) {
            return AlignedBuf {
                ptr,
                len,
                cap,
                recycled: true,
            };
        }
        let layout = Layout::from_size_align(cap, ALIGN).expect("buffer layout");
        // SAFETY: layout has non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            len,
            cap,
            recycled: false,
        }
    }

    pub fn from_slice(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::for_overwrite(data.len());
        b.copy_from_slice(data);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shrink the visible length (capacity stays).
    pub fn truncate(&mut self, len: usize) {
        assert!(len <= self.cap);
        self.len = len.min(self.len);
    }

    pub fn into_shared(self) -> SharedBuf {
        let len = self.len;
        SharedBuf {
            inner: Arc::new(SharedInner(UnsafeCell::new(self))),
            range: 0..len,
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if pool::give(self.ptr, self.cap) {
            return;
        }
        // SAFETY: allocated in `for_overwrite` with this capacity, and dropped now.
        unsafe { free(self.ptr, self.cap) }
    }
}

/// Give a buffer's memory back to the allocator.
///
/// # Safety
/// `ptr` was allocated by [`AlignedBuf::for_overwrite`] with capacity `cap`, and nothing
/// refers to it any more.
unsafe fn free(ptr: NonNull<u8>, cap: usize) {
    let layout = Layout::from_size_align(cap, ALIGN).expect("buffer layout");
    // SAFETY: as the caller promises.
    unsafe { dealloc(ptr.as_ptr(), layout) }
}

/// A recycling pool of buffers by power-of-two size class (4 KiB to 32 MiB), sharded to
/// keep threads apart. Every pooled buffer is initialised memory (zeroed when first
/// allocated, then written by its users), so handing it out again is sound.
///
/// Each class keeps up to 16 MiB a shard. Large buffers (1 MiB and up: a distributed
/// rebuild's runs of 4 MiB, up to its 1 GiB budget of them under way) may also take a
/// shared share of up to [`pool::BIG_BYTES`]: with 16 MiB a shard, most of a rebuild's
/// run buffers came from fresh memory, and zeroing its pages as they faulted in was
/// 45% of the server's CPU at 48 modelled members of 4 GiB (docs/PERFORMANCE.md).
/// That share is given back to the allocator once no large buffer was taken for
/// [`pool::IDLE`]: memory a burst of work needed is not held for good.
mod pool {
    use super::ALIGN;
    use parking_lot::Mutex;
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::time::Duration;

    const CLASSES: usize = 14; // 4K << 0 ..= 4K << 13 = 32 MiB
    const SHARDS: usize = 8;
    /// Bytes each class may hold per shard.
    const CLASS_BYTES: usize = 16 << 20;
    /// The least capacity that may use the shared share.
    const BIG: usize = 1 << 20;
    /// The shared share of large buffers, over every class and shard.
    pub const BIG_BYTES: usize = 512 << 20;
    /// How long the shared share is kept with no large buffer taken.
    pub const IDLE: Duration = Duration::from_secs(5);

    struct Ptr(NonNull<u8>);
    // SAFETY: the pool owns the allocations it holds.
    unsafe impl Send for Ptr {}

    /// One class of one shard: buffers within its own share, and buffers of the shared
    /// share (large classes only).
    struct Class {
        own: Vec<Ptr>,
        shared: Vec<Ptr>,
    }

    #[allow(clippy::type_complexity)]
    static POOL: [[Mutex<Class>; CLASSES]; SHARDS] = [const {
        [const {
            Mutex::new(Class {
                own: Vec::new(),
                shared: Vec::new(),
            })
        }; CLASSES]
    }; SHARDS];
    /// Bytes held in the shared share.
    static SHARED: AtomicUsize = AtomicUsize::new(0);
    /// When a large buffer was last taken (ms, `member::clock_ms`).
    static BIG_TAKEN: AtomicU64 = AtomicU64::new(0);
    static TRIMMER: std::sync::Once = std::sync::Once::new();

    fn class(cap: usize) -> Option<usize> {
        if !cap.is_power_of_two() || cap < ALIGN {
            return None;
        }
        let c = (cap / ALIGN).trailing_zeros() as usize;
        (c < CLASSES).then_some(c)
    }

    fn shard() -> usize {
        thread_local! { static ID: usize = {
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        }}
        ID.with(|i| *i % SHARDS)
    }

    /// A pooled buffer of exactly `cap` bytes (power-of-two capacities only).
    pub fn take(cap: usize) -> Option<(NonNull<u8>, usize)> {
        let c = class(cap)?;
        if cap >= BIG {
            BIG_TAKEN.store(crate::member::clock_ms(), Ordering::Relaxed);
        }
        let s = shard();
        for i in 0..SHARDS {
            let mut v = POOL[(s + i) % SHARDS][c].lock();
            if let Some(p) = v.shared.pop() {
                SHARED.fetch_sub(cap, Ordering::Relaxed);
                return Some((p.0, cap));
            }
            if let Some(p) = v.own.pop() {
                return Some((p.0, cap));
            }
        }
        None
    }

    /// Keep a buffer for reuse; false if the pool is full (the caller frees it).
    pub fn give(ptr: NonNull<u8>, cap: usize) -> bool {
        let Some(c) = class(cap) else { return false };
        let mut v = POOL[shard()][c].lock();
        if (v.own.len() + 1) * cap <= CLASS_BYTES.max(cap) {
            v.own.push(Ptr(ptr));
            return true;
        }
        if cap < BIG
            || SHARED
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                    (h + cap <= BIG_BYTES).then_some(h + cap)
                })
                .is_err()
        {
            return false;
        }
        v.shared.push(Ptr(ptr));
        drop(v);
        TRIMMER.call_once(|| {
            let _ = std::thread::Builder::new()
                .name("sbod-buf-trim".into())
                .spawn(|| loop {
                    std::thread::sleep(IDLE);
                    trim_idle();
                });
        });
        true
    }

    /// Give the shared share back to the allocator if no large buffer was taken for
    /// [`IDLE`]. Returns the bytes freed.
    pub fn trim_idle() -> usize {
        let idle = crate::member::clock_ms().saturating_sub(BIG_TAKEN.load(Ordering::Relaxed));
        if idle < IDLE.as_millis() as u64 || SHARED.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let mut freed = 0;
        for shard in &POOL {
            for (c, class) in shard.iter().enumerate() {
                let gone = std::mem::take(&mut class.lock().shared);
                let cap = ALIGN << c;
                for p in gone {
                    SHARED.fetch_sub(cap, Ordering::Relaxed);
                    freed += cap;
                    // SAFETY: allocated in `for_overwrite` with this capacity, and the
                    // pool owned it (no buffer refers to it).
                    unsafe { super::free(p.0, cap) }
                }
            }
        }
        freed
    }

    /// Bytes held in the shared share now.
    #[cfg(test)]
    pub fn shared_bytes() -> usize {
        SHARED.load(Ordering::Relaxed)
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len bytes, initialised (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

struct SharedInner(UnsafeCell<AlignedBuf>);
// SAFETY: access discipline is documented on SharedBuf: concurrent users touch disjoint
// ranges, and reads of a range only happen after writes to it have completed.
unsafe impl Send for SharedInner {}
unsafe impl Sync for SharedInner {}

/// A view of part of a shared aligned buffer.
///
/// Contract: the engine hands out views of disjoint ranges to concurrent I/Os, and only
/// reads a range after the I/O writing it has completed. That is the one invariant the
/// `unsafe` here relies on; it is kept by the stripe planner, which never issues two member
/// I/Os over the same bytes of one buffer.
#[derive(Clone)]
pub struct SharedBuf {
    inner: Arc<SharedInner>,
    range: Range<usize>,
}

impl SharedBuf {
    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// A sub-view, `r` relative to this view.
    pub fn slice(&self, r: Range<usize>) -> SharedBuf {
        assert!(
            r.start <= r.end && r.end <= self.range.len(),
            "slice out of range"
        );
        SharedBuf {
            inner: self.inner.clone(),
            range: self.range.start + r.start..self.range.start + r.end,
        }
    }

    pub fn as_ptr(&self) -> *const u8 {
        // SAFETY: the range lies inside the buffer.
        unsafe { (*self.inner.0.get()).ptr.as_ptr().add(self.range.start) }
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        // SAFETY: as above; writes follow the disjointness contract.
        unsafe { (*self.inner.0.get()).ptr.as_ptr().add(self.range.start) }
    }

    /// # Safety
    /// No I/O may be writing this range concurrently.
    pub unsafe fn as_slice(&self) -> &[u8] {
        std::slice::from_raw_parts(self.as_ptr(), self.len())
    }

    /// # Safety
    /// No other view of this range may be in use concurrently.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len())
    }

    /// Take the buffer back once every other view is gone. Returns the view unchanged
    /// if views are still alive.
    pub fn try_unwrap(self) -> Result<AlignedBuf, SharedBuf> {
        let range = self.range.clone();
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => Ok(inner.0.into_inner()),
            Err(inner) => Err(SharedBuf { inner, range }),
        }
    }
}

impl std::fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBuf({:?})", self.range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of large buffers freed together comes back from the pool, not from fresh
    /// memory (whose pages fault in as they are zeroed): beyond a class's 16 MiB a shard,
    /// the shared share takes them. Given back to the allocator only once no large
    /// buffer was taken for a while.
    #[test]
    fn a_burst_of_large_buffers_is_reused() {
        const N: usize = 40;
        const LEN: usize = 4 << 20;
        let burst: Vec<AlignedBuf> = (0..N).map(|_| AlignedBuf::for_overwrite(LEN)).collect();
        drop(burst);
        assert!(
            pool::shared_bytes() >= (N - 8) * LEN,
            "only {} bytes of {N} freed 4 MiB buffers kept beyond the shard's own",
            pool::shared_bytes()
        );
        let again: Vec<AlignedBuf> = (0..N).map(|_| AlignedBuf::for_overwrite(LEN)).collect();
        let recycled = again.iter().filter(|b| b.recycled).count();
        assert!(
            recycled >= N - 4,
            "{recycled} of {N} buffers came from the pool"
        );
        drop(again);
        assert_eq!(
            pool::trim_idle(),
            0,
            "trimmed while large buffers are in use"
        );
    }
}
