//! Two heads on the same members (issue 25): a second head is refused while the first's
//! heartbeat runs; a crashed head's members are taken over after its lease; a forced
//! takeover fences the first head, whose writes then fail, and the new head reads every
//! acknowledged write; a paused head that comes back after a takeover writes nothing; one
//! member under two names is refused. Two `Array`s in one process with different host
//! ids are two hosts (the files are opened without flock, as a second host would reach
//! them over the network).

use crate::torture_util;
use torture_util::{blocks_of, decode, BLOCK};

use sbod_core::dev::{self, file, BlockDev};
use sbod_core::owner::{self, Config};
use sbod_core::{AlignedBuf, Array, AssembleOptions, CreateSpec, Error, Level, MemberSpec};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn make_files(dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("m{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(8 * MIB).unwrap();
            p
        })
        .collect()
}

/// Open a member as another host would: no flock (it cannot see this host's locks).
fn open_as(p: &Path, name: String) -> MemberSpec {
    let opts = file::OpenOptions {
        threads: 2,
        exclusive: false,
        ..Default::default()
    };
    let o = file::open(p, &opts).unwrap();
    let dev: Arc<dyn BlockDev> = dev::attach_member(name.clone(), o, &opts).unwrap();
    MemberSpec {
        dev,
        path: name,
        is_file: !name_is_device(p),
        domain: String::new(),
    }
}

fn name_is_device(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
}

fn open(p: &Path) -> MemberSpec {
    open_as(p, p.display().to_string())
}

fn host(name: &str) -> Config {
    Config {
        host: uuid::Uuid::new_v4(),
        host_name: name.into(),
        // Short, but long enough for a loaded test machine: a lease of 1 s.
        interval: Duration::from_millis(100),
        lease_multiple: 10,
    }
}

fn spec() -> CreateSpec {
    CreateSpec {
        name: "two".into(),
        level: Level::Raid5,
        chunk: 64 * 1024,
        groups: 1,
        spares: 0,
        declustered: false,
        copies: 2,
        bitmap_region: None,
        assume_clean: true,
        integrity: sbod_core::integrity::Kind::Crc32c,
        force: false,
    }
}

async fn create(paths: &[PathBuf]) {
    let a = Array::create(spec(), paths.iter().map(|p| open(p)).collect())
        .await
        .unwrap();
    a.close().await.unwrap();
}

async fn head(paths: &[PathBuf], cfg: &Config, force: bool) -> Result<Arc<Array>, Error> {
    Array::assemble(
        paths.iter().map(|p| open(p)).collect(),
        AssembleOptions {
            no_processes: true,
            force,
            owner: Some(cfg.clone()),
            ..Default::default()
        },
    )
    .await
}

async fn write_tag(a: &Array, tag: u64, blk: u64) -> Result<(), Error> {
    let data = AlignedBuf::from_slice(&blocks_of(tag, blk, 1));
    a.write(blk * BLOCK as u64, data, false).await
}

/// Every file's bytes but the owner block (which a live head rewrites every interval).
fn images(paths: &[PathBuf]) -> Vec<Vec<u8>> {
    paths
        .iter()
        .map(|p| {
            let mut b = std::fs::read(p).unwrap();
            let at = sbod_core::superblock::OWNER_OFFSET as usize;
            b[at..at + owner::BLOCK].fill(0);
            b
        })
        .collect()
}

#[test]
fn a_second_head_is_refused_while_the_first_serves() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_files(dir.path(), 4);
        create(&paths).await;
        let a = head(&paths, &host("host-a"), false).await.unwrap();
        write_tag(&a, 1, 0).await.unwrap();
        let before = images(&paths);
        let e = match head(&paths, &host("host-b"), false).await {
            Err(e) => e,
            Ok(_) => panic!("a second head started on members another head serves"),
        };
        let msg = e.to_string();
        assert!(matches!(e, Error::Refused(_)), "{e:?}");
        assert!(msg.contains("in use by host host-a"), "{msg}");
        assert!(msg.contains("last seen"), "{msg}");
        assert!(
            e.advice()
                .iter()
                .any(|s| matches!(s, sbod_core::error::Step::Force { .. })),
            "the refusal says how to take the members over: {:?}",
            e.advice()
        );
        // The refused head wrote nothing but its claim attempt's owner blocks... and not
        // even those: it only watched.
        assert!(
            images(&paths) == before,
            "the refused head wrote to the members"
        );
        // The first head goes on.
        write_tag(&a, 2, 1).await.unwrap();
        a.close().await.unwrap();
        // A clean stop released the members: every owner block says so.
        for p in &paths {
            let m = open(p);
            let b = owner::read_block(&m.dev)
                .await
                .unwrap()
                .expect("an owner block");
            assert!(
                b.released,
                "{} is not released after a clean stop",
                p.display()
            );
            assert_eq!(b.host_name, "host-a");
            m.dev.close();
        }
        // Another host starts it at once, and reads what the first wrote.
        let b = head(&paths, &host("host-b"), false).await.unwrap();
        let got = b.read(0, 2 * BLOCK).await.unwrap();
        assert_eq!(decode(&got[..BLOCK], 0), Some(1));
        assert_eq!(decode(&got[BLOCK..], 1), Some(2));
        b.close().await.unwrap();
    });
}

#[test]
fn a_crashed_heads_members_are_taken_over_after_its_lease() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_files(dir.path(), 4);
        create(&paths).await;
        let a = head(&paths, &host("host-a"), false).await.unwrap();
        for b in 0..16 {
            write_tag(&a, 10 + b, b).await.unwrap();
        }
        // A power cut: the heartbeat stops, the owner blocks still name host-a.
        a.abandon().await;
        let b = head(&paths, &host("host-b"), false).await.unwrap();
        let got = b.read(0, 16 * BLOCK).await.unwrap();
        for blk in 0..16u64 {
            let at = blk as usize * BLOCK;
            assert_eq!(decode(&got[at..at + BLOCK], blk), Some(10 + blk));
        }
        let m = open(&paths[0]);
        let blk = owner::read_block(&m.dev).await.unwrap().unwrap();
        assert_eq!(blk.host_name, "host-b", "the new head holds the members");
        m.dev.close();
        b.close().await.unwrap();
    });
}

#[test]
fn a_forced_takeover_fences_the_old_head_and_loses_no_acknowledged_write() {
    // A torture: each round takes over at another point of host A's writes (seeded:
    // SBOD_TORTURE_SEED replays a run, SBOD_TORTURE_ITERS sets the rounds).
    let seed = torture_util::seed();
    let rounds = torture_util::iters(3);
    for round in 0..rounds {
        println!("forced takeover round {round}, seed {seed}");
        forced_takeover_round(seed.wrapping_add(round));
    }
    torture_util::report(serde_json::json!({
        "test": "two_heads_forced_takeover",
        "seed": seed,
        "rounds": rounds,
    }));
}

fn forced_takeover_round(seed: u64) {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_files(dir.path(), 4);
        create(&paths).await;
        let a = head(&paths, &host("host-a"), false).await.unwrap();
        const BLOCKS: u64 = 64;
        // Where in A's writes B starts: 0 to 300 ms in.
        let delay = Duration::from_millis(seed % 300);
        let stride = [7u64, 13, 29, 1][(seed / 300 % 4) as usize];
        // Host A writes on while host B takes the members over: each write's tag is
        // recorded as issued, then as acknowledged.
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let a = a.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut acked = vec![0u64; BLOCKS as usize];
                let mut unacked: Vec<(u64, u64)> = Vec::new();
                let mut tag = 100;
                let mut err = None;
                while !stop.load(Ordering::Acquire) {
                    tag += 1;
                    let blk = tag * stride % BLOCKS;
                    match write_tag(&a, tag, blk).await {
                        Ok(()) => acked[blk as usize] = tag,
                        Err(e) => {
                            unacked.push((blk, tag));
                            err = Some(e.to_string());
                            break;
                        }
                    }
                }
                (acked, unacked, err)
            })
        };
        tokio::time::sleep(delay).await;
        let b = head(&paths, &host("host-b"), true).await.unwrap();
        stop.store(true, Ordering::Release);
        let (acked, unacked, err) = writer.await.unwrap();
        // The takeover really met A writing.
        assert!(
            acked.iter().any(|&t| t > 0),
            "seed {seed}: host A wrote nothing"
        );
        // By the time B is started, A is fenced: its next write fails, whatever it did.
        let e = write_tag(&a, 1, 0)
            .await
            .expect_err("the old head still writes");
        assert!(
            e.to_string()
                .contains("fenced: members taken over by host-b"),
            "{e}"
        );
        assert!(
            a.status()
                .fenced
                .is_some_and(|f| f.contains("members taken over by host-b")),
            "status says fenced"
        );
        if let Some(err) = &err {
            assert!(err.contains("fenced") || err.contains("lease"), "{err}");
        }
        // Every block reads back as A's last acknowledged write, or a newer write that
        // failed (it may have landed), never anything else.
        let got = b.read(0, BLOCKS as usize * BLOCK).await.unwrap();
        for blk in 0..BLOCKS {
            let at = blk as usize * BLOCK;
            let g = decode(&got[at..at + BLOCK], blk);
            let ok = g == Some(acked[blk as usize])
                || unacked.iter().any(|&(b, t)| b == blk && Some(t) == g);
            assert!(
                ok,
                "block {blk}: read {g:?}, last acknowledged {}",
                acked[blk as usize]
            );
        }
        // The new head writes and reads as usual; the old one wrote nothing since.
        write_tag(&b, 5, 0).await.unwrap();
        let got = b.read(0, BLOCK).await.unwrap();
        assert_eq!(decode(&got, 0), Some(5));
        a.close().await.ok();
        b.close().await.unwrap();
    });
}

#[test]
fn a_paused_head_that_comes_back_after_a_takeover_writes_nothing() {
    paused_head_after_a_takeover(false);
}

#[test]
fn a_paused_head_that_comes_back_after_a_takeover_and_a_clean_stop_writes_nothing() {
    // B has stopped cleanly (its owner blocks say released) by the time A comes back.
    // Released blocks of another session on members A has held in this session mean
    // another head ran on them: A's in-memory state (its superblock event, bitmap, tags)
    // is stale, and it must write nothing, as if B still held them. (Before, A took the
    // blocks back, and its first partial-stripe write read B's bytes against its own
    // stale tags and failed the array.)
    paused_head_after_a_takeover(true);
}

/// A stops beating (SIGSTOP, a partition); B sees the heartbeat stopped and takes the
/// members over without force, writes, and (`b_stops`) stops cleanly; then A comes back.
fn paused_head_after_a_takeover(b_stops: bool) {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_files(dir.path(), 4);
        create(&paths).await;
        let a = head(&paths, &host("host-a"), false).await.unwrap();
        write_tag(&a, 1, 0).await.unwrap();
        a.pause_heartbeat(true);
        let b = head(&paths, &host("host-b"), false).await.unwrap();
        write_tag(&b, 7, 1).await.unwrap();
        let b = if b_stops {
            b.close().await.unwrap();
            None
        } else {
            Some(b)
        };
        let before = images(&paths);
        // A comes back: its lease lapsed, so its writes re-check ownership first.
        a.pause_heartbeat(false);
        let e = write_tag(&a, 2, 0)
            .await
            .expect_err("the paused head wrote");
        assert!(e.to_string().contains("taken over by host-b"), "{e}");
        let e = a
            .write_zeroes(0, 64 * 1024, false, false)
            .await
            .expect_err("zeroes");
        assert!(e.to_string().contains("fenced"), "{e}");
        assert!(a.flush().await.is_err(), "a fenced head flushes nothing");
        a.close().await.ok();
        assert!(
            images(&paths) == before,
            "the paused head wrote to the members after the takeover"
        );
        // The members hold B's bytes and A's acknowledged one, for B or whoever starts
        // the array next.
        let r = match b {
            Some(b) => b,
            None => head(&paths, &host("host-c"), false).await.unwrap(),
        };
        let got = r.read(0, 2 * BLOCK).await.unwrap();
        assert_eq!(decode(&got[..BLOCK], 0), Some(1));
        assert_eq!(decode(&got[BLOCK..], 1), Some(7));
        r.close().await.unwrap();
    });
}

#[test]
fn one_member_under_two_names_is_refused() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_files(dir.path(), 4);
        // A symlink: two paths, one file (found by device and inode, nothing written).
        let link = dir.path().join("alias.img");
        std::os::unix::fs::symlink(&paths[1], &link).unwrap();
        let specs = vec![
            open(&paths[0]),
            open(&paths[1]),
            open(&link),
            open(&paths[2]),
        ];
        let e = Array::create(spec(), specs)
            .await
            .err()
            .expect("created on one file twice");
        assert!(
            e.to_string().contains(&format!(
                "{} and {} are the same member",
                paths[1].display(),
                link.display()
            )),
            "{e}"
        );
        // Under names that say nothing local (as remote members are): the nonce each
        // gets in its owner block, read back from all, tells.
        let specs = vec![
            open_as(&paths[0], "nbd://h1/a".into()),
            open_as(&paths[1], "nbd://h1/b".into()),
            open_as(&paths[1], "nbd://h2/b".into()),
            open_as(&paths[2], "nbd://h1/c".into()),
        ];
        let e = Array::create(spec(), specs)
            .await
            .err()
            .expect("created on one export twice");
        assert!(
            e.to_string()
                .contains("nbd://h1/b and nbd://h2/b are the same member"),
            "{e}"
        );
        // Nothing was left behind: the files are still blank.
        for p in &paths {
            assert!(std::fs::read(p).unwrap().iter().all(|&x| x == 0));
        }
        // Adding a member of the array under another name is refused too.
        let a = Array::create(spec(), paths[..3].iter().map(|p| open(p)).collect())
            .await
            .unwrap();
        let e = a
            .add(open_as(&paths[0], "nbd://h3/a".into()), true)
            .await
            .expect_err("added a member of the array as a spare");
        assert!(e.to_string().contains("are the same member"), "{e}");
        let e = a
            .add(open(&link), true)
            .await
            .expect_err("added by a symlink");
        assert!(e.to_string().contains("are the same member"), "{e}");
        a.close().await.unwrap();
    });
}

/// A loop device over a member file: attached for the test, detached on drop.
struct Loop(String);

impl Loop {
    fn attach(file: &Path) -> Loop {
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(file)
            .output()
            .expect("losetup (util-linux) is needed for this test: install util-linux");
        assert!(
            out.status.success(),
            "losetup failed (run as root with loop devices): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop(String::from_utf8(out.stdout).unwrap().trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

#[test]
fn a_file_and_a_loop_device_over_it_are_one_member() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let paths = make_files(dir.path(), 4);
        let lo = Loop::attach(&paths[3]);
        let specs = vec![
            open(&paths[0]),
            open(&paths[1]),
            open(&paths[3]),
            open(Path::new(&lo.0)),
        ];
        let e = Array::create(spec(), specs)
            .await
            .err()
            .expect("created on one file twice");
        assert!(
            e.to_string().contains(&format!(
                "{} and {} are the same member",
                paths[3].display(),
                lo.0
            )),
            "{e}"
        );
        // Two hosts: one through the files, the other through the loop device.
        create(&paths).await;
        let a = head(&paths, &host("host-a"), false).await.unwrap();
        let mut other: Vec<MemberSpec> = paths[..3].iter().map(|p| open(p)).collect();
        other.push(open(Path::new(&lo.0)));
        let e = Array::assemble(
            other,
            AssembleOptions {
                no_processes: true,
                owner: Some(host("host-b")),
                ..Default::default()
            },
        )
        .await
        .err()
        .expect("a second head through a loop device");
        assert!(e.to_string().contains("in use by host host-a"), "{e}");
        a.close().await.unwrap();
        drop(lo);
    });
}

/// A member whose owner-block I/O (the heartbeat's, `IoClass::Urgent`) takes `delay`, as
/// behind a drive's deep queue, or fails while `down` is set, as behind a link that is
/// down for a while; data I/O goes straight through.
struct OwnerIo {
    inner: Arc<dyn BlockDev>,
    delay: Duration,
    down: Arc<AtomicBool>,
    held: Arc<std::sync::atomic::AtomicU64>,
}

impl BlockDev for OwnerIo {
    fn submit(&self, req: dev::IoReq, done: dev::Done) {
        if req.class != dev::IoClass::Urgent {
            return self.inner.submit(req, done);
        }
        if self.down.load(Ordering::Acquire) {
            return done(Err(std::io::Error::other("link down")));
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        let (inner, delay) = (self.inner.clone(), self.delay);
        if delay.is_zero() {
            return inner.submit(req, done);
        }
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            inner.submit(req, done);
        });
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn current_size(&self) -> std::io::Result<u64> {
        self.inner.current_size()
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn close(&self) {
        self.inner.close()
    }
}

/// Assemble the array on `paths` as `cfg`'s host, each member behind an [`OwnerIo`] with
/// `delay` and `down`; returns it and the count of owner-block I/Os.
async fn head_with_owner_io(
    paths: &[PathBuf],
    cfg: Config,
    delay: Duration,
    down: &Arc<AtomicBool>,
) -> (Arc<Array>, Arc<std::sync::atomic::AtomicU64>) {
    let held = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let members: Vec<MemberSpec> = paths
        .iter()
        .map(|p| {
            let m = open(p);
            MemberSpec {
                dev: Arc::new(OwnerIo {
                    inner: m.dev,
                    delay,
                    down: down.clone(),
                    held: held.clone(),
                }),
                ..m
            }
        })
        .collect();
    let a = Array::assemble(
        members,
        AssembleOptions {
            no_processes: true,
            owner: Some(cfg),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    (a, held)
}

#[test]
fn slow_heartbeats_keep_the_lease() {
    // A lease of 4 s (100 ms beats); every owner-block read and write takes 1.1 s, so a
    // beat takes 2.2 s or more: more than half the lease (the old patience), and with the
    // next beat an interval after it ends, more than the lease's renewal could cover.
    // Beats that overlap, each renewing from when it began and spread over the beat's
    // duration, keep the lease: no write is refused. Started in a burst of one per
    // interval until the slots run out, the next beat would begin a whole beat after the
    // burst's last and end past its lease (as a first version did, on CI). Margins for a
    // loaded machine: a renewal lands about 1.2 s before the lease it extends ends.
    let dir = tempfile::tempdir().unwrap();
    let paths = make_files(dir.path(), 4);
    rt().block_on(async {
        create(&paths).await;
        let (a, held) = head_with_owner_io(
            &paths,
            Config {
                lease_multiple: 40,
                ..host("slow")
            },
            Duration::from_millis(1100),
            &Arc::new(AtomicBool::new(false)),
        )
        .await;
        let began = std::time::Instant::now();
        let mut n = 0u64;
        while began.elapsed() < Duration::from_secs(9) {
            if let Err(e) = write_tag(&a, n, n % 64).await {
                panic!("write {n} after {:?} refused: {e}", began.elapsed());
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(a.status().state != "failed");
        // Beats ran throughout (two owner-block I/Os per member each).
        let held = held.load(Ordering::Relaxed);
        assert!(held >= 4 * 2 * 5, "only {held} owner-block I/Os in 9 s");
        a.close().await.unwrap();
    });
}

#[test]
fn a_write_waits_out_a_short_lapse_of_the_lease() {
    // Lease 1 s. The heartbeat cannot reach the members for 1.5 s and more: the lease
    // lapses. A client write then waits (as MMP suspends a pool) and goes on once the
    // heartbeat renews the lease, instead of failing with EIO after a blip shorter than
    // a remote member's give-up time. A lapse longer than the wait (4 leases) is refused,
    // and the array is not failed by either.
    let dir = tempfile::tempdir().unwrap();
    let paths = make_files(dir.path(), 4);
    rt().block_on(async {
        create(&paths).await;
        let down = Arc::new(AtomicBool::new(false));
        let (a, _) = head_with_owner_io(&paths, host("blip"), Duration::ZERO, &down).await;
        write_tag(&a, 1, 0).await.unwrap();
        down.store(true, Ordering::Release);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let w = {
            let a = a.clone();
            tokio::spawn(async move { write_tag(&a, 2, 1).await })
        };
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(!w.is_finished(), "the write did not wait for the lease");
        down.store(false, Ordering::Release);
        w.await
            .unwrap()
            .expect("a write refused after a short lapse of the lease");
        // A long lapse: refused once the wait is over, and the array is not failed.
        down.store(true, Ordering::Release);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let e = write_tag(&a, 3, 2)
            .await
            .expect_err("written with the lease lapsed");
        assert!(e.to_string().contains("lease"), "{e}");
        down.store(false, Ordering::Release);
        write_tag(&a, 4, 3).await.unwrap();
        assert_ne!(a.status().state, "failed");
        let got = a.read(0, 4 * BLOCK).await.unwrap();
        assert_eq!(decode(&got[..BLOCK], 0), Some(1));
        assert_eq!(decode(&got[BLOCK..2 * BLOCK], 1), Some(2));
        assert_eq!(decode(&got[3 * BLOCK..], 3), Some(4));
        a.close().await.unwrap();
    });
}
