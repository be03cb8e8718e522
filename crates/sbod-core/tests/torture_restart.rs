//! Restarting right after a crash. A server killed with I/O in flight keeps its member
//! files locked until the kernel has torn its io_uring down, a few to tens of
//! milliseconds after the process is gone (the crash harness met this: the restart took
//! every member for "in use by another sbod process" and assembled without them). Opening
//! a member waits a moment for such a lock; one held for good is still refused.

use sbod_core::dev::file::{self, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

fn lock(f: &std::fs::File) {
    // SAFETY: plain syscall on an open file.
    assert_eq!(
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
}

#[test]
fn a_lock_left_by_a_dying_process_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m0.img");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(4 << 20).unwrap();
    // Another open file description holds the lock, as the dying server's ring does.
    let holder = std::fs::File::open(&p).unwrap();
    lock(&holder);
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(holder);
    });
    let opened = file::open(&p, &OpenOptions::default());
    release.join().unwrap();
    assert!(
        opened.is_ok(),
        "a lock released 100 ms later made the member unusable: {:?}",
        opened.err()
    );
}

#[test]
fn a_lock_held_for_good_is_still_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m0.img");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(4 << 20).unwrap();
    let holder = std::fs::File::open(&p).unwrap();
    lock(&holder);
    let t = Instant::now();
    let e = file::open(&p, &OpenOptions::default())
        .err()
        .expect("opened a member another process holds");
    assert_eq!(e.kind(), std::io::ErrorKind::ResourceBusy);
    assert!(
        e.to_string().contains("in use by another sbod process"),
        "{e}"
    );
    assert!(t.elapsed() >= Duration::from_secs(1), "gave up at once");
    drop(holder);
}
