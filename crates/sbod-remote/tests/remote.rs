//! Remote members against real servers (sbod's own NBD server, nbdkit), through links that
//! break, and against hostile servers that must fail the member without ever handing the
//! engine bytes they did not mean.

use sbod_core::buf::AlignedBuf;
use sbod_core::dev::{self, BlockDev, IoClass, IoKind, IoReq};
use sbod_nbd::proto::*;
use sbod_nbd::{Listen, MemBackend, Server};
use sbod_remote::{LinkState, RemoteDev, RemoteOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// sbod's NBD server on a memory export, in its own thread, on a Unix socket or TCP.
struct MemServer {
    backend: Arc<MemBackend>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MemServer {
    fn start(backend: Arc<MemBackend>, listen: Listen) -> MemServer {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = Server::new(vec![("disk".to_string(), backend.clone())]);
        let l = listen.clone();
        let (up_tx, up_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            rt().block_on(async move {
                let _ = up_tx.send(());
                server
                    .serve(vec![l], async move {
                        let _ = rx.await;
                    })
                    .await
                    .unwrap();
            })
        });
        up_rx.recv().unwrap();
        // Wait until it accepts.
        for _ in 0..200 {
            let ok = match &listen {
                Listen::Unix(p) => std::os::unix::net::UnixStream::connect(p).is_ok(),
                Listen::Tcp(a) => TcpStream::connect(a).is_ok(),
            };
            if ok {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        MemServer {
            backend,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MemServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A memory export on a Unix socket in a fresh folder, and its URI.
fn unix_server(size: u64) -> (tempfile::TempDir, MemServer, String) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let srv = MemServer::start(Arc::new(MemBackend::new(size)), Listen::Unix(sock.clone()));
    let uri = format!("nbd+unix:///disk?socket={}", sock.display());
    (dir, srv, uri)
}

fn opts() -> RemoteOptions {
    RemoteOptions {
        connections: 3,
        connect_timeout: Duration::from_millis(500),
        io_timeout: Duration::from_millis(700),
        give_up: Duration::from_millis(1500),
        read_only: false,
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn write(dev: &Arc<dyn BlockDev>, off: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
    rt().block_on(dev::write_at(
        dev,
        off,
        AlignedBuf::from_slice(data).into_shared(),
        fua,
        IoClass::Foreground,
    ))
}

fn read(dev: &Arc<dyn BlockDev>, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let buf = AlignedBuf::zeroed(len).into_shared();
    rt().block_on(dev::read_at(dev, off, buf.clone(), IoClass::Foreground))?;
    Ok(buf.try_unwrap().unwrap().to_vec())
}

fn zero(dev: &Arc<dyn BlockDev>, off: u64, len: u64) -> std::io::Result<()> {
    rt().block_on(dev::io(
        dev,
        IoReq {
            offset: off,
            kind: IoKind::Zero { len, punch: false },
            class: IoClass::Foreground,
        },
    ))
}

#[test]
fn reads_writes_flushes_and_zeroes_reach_the_export() {
    let (_dir, srv, uri) = unix_server(8 << 20);
    let remote = RemoteDev::open(&uri, opts()).unwrap();
    assert_eq!(
        remote.connections(),
        3,
        "multi-conn export gets several connections"
    );
    let dev: Arc<dyn BlockDev> = remote.clone();
    assert_eq!(dev.size(), 8 << 20);
    assert_eq!(dev.link_up(), Some(true));
    let a = pattern(1, 1 << 20);
    write(&dev, 4096, &a, false).unwrap();
    write(&dev, (2 << 20) + 8192, &a[..65536], true).unwrap();
    rt().block_on(dev::flush(&dev)).unwrap();
    let snap = srv.backend.snapshot();
    assert_eq!(&snap[4096..4096 + a.len()], &a[..]);
    assert_eq!(read(&dev, 4096, a.len()).unwrap(), a);
    zero(&dev, 8192, 16384).unwrap();
    let got = read(&dev, 4096, 32768).unwrap();
    assert_eq!(&got[..4096], &a[..4096]);
    assert!(got[4096..4096 + 16384].iter().all(|&b| b == 0));
    assert_eq!(&got[20480..], &a[20480..32768]);
    // Out of range: the server's error comes back as an error.
    assert!(read(&dev, (8 << 20) - 4096, 8192).is_err());
    // Concurrent requests from many threads land where they should.
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let dev = dev.clone();
            s.spawn(move || {
                for i in 0..16u64 {
                    let off = (4 << 20) + (t as u64 * 16 + i) * 4096;
                    let d = pattern(t * 16 + i as u8, 4096);
                    write(&dev, off, &d, false).unwrap();
                    assert_eq!(read(&dev, off, 4096).unwrap(), d);
                }
            });
        }
    });
    dev.close();
    assert!(read(&dev, 0, 4096).is_err(), "a closed member refuses I/O");
}

#[test]
fn members_opened_in_a_runtime_run_their_tasks_there() {
    let (_dir, srv, uri) = unix_server(2 << 20);
    let rt = rt();
    let remote = rt.block_on(async {
        tokio::task::spawn_blocking(move || RemoteDev::open(&uri, opts()).unwrap())
            .await
            .unwrap()
    });
    assert!(
        remote.shares_runtime(),
        "no thread of its own inside a runtime"
    );
    let dev: Arc<dyn BlockDev> = remote;
    let a = pattern(9, 256 << 10);
    write(&dev, 8192, &a, true).unwrap();
    assert_eq!(read(&dev, 8192, a.len()).unwrap(), a);
    assert_eq!(&srv.backend.snapshot()[8192..8192 + a.len()], &a[..]);
    dev.close();
    assert!(read(&dev, 0, 4096).is_err(), "a closed member refuses I/O");
    drop(rt);
}

#[test]
fn nbdkit_exports_work_as_members() {
    assert!(
        std::process::Command::new("nbdkit")
            .arg("--version")
            .output()
            .is_ok(),
        "nbdkit is not installed: run scripts/deps.sh (it installs nbdkit)"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let sock = dir.path().join("k.sock");
    let mut kit = std::process::Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "-U"])
        .arg(&sock)
        .args(["--filter=delay", "file"])
        .arg(&file)
        .args(["cache=none", "rdelay=2ms", "wdelay=2ms"])
        .spawn()
        .unwrap();
    let _kill = KillOnDrop(&mut kit);
    wait_for(&sock);
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let dev: Arc<dyn BlockDev> = RemoteDev::open(&uri, opts()).unwrap();
    assert_eq!(dev.size(), 4 << 20);
    let a = pattern(7, 256 << 10);
    write(&dev, 65536, &a, true).unwrap();
    rt().block_on(dev::flush(&dev)).unwrap();
    assert_eq!(read(&dev, 65536, a.len()).unwrap(), a);
    zero(&dev, 65536, 4096).unwrap();
    assert!(read(&dev, 65536, 4096).unwrap().iter().all(|&b| b == 0));
    dev.close();
    // What the member wrote is in the file.
    let on_disk = std::fs::read(&file).unwrap();
    assert_eq!(&on_disk[65536 + 4096..65536 + a.len()], &a[4096..]);
}

struct KillOnDrop<'a>(&'a mut std::process::Child);
impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(sock: &std::path::Path) {
    for _ in 0..500 {
        if sock.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{} never came up", sock.display());
}

/// A TCP proxy that can cut every connection and refuse new ones (a link down), then let
/// them through again.
struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn start(target: std::net::SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::<TcpStream>::new()));
        let (u, s, c) = (up.clone(), stop.clone(), conns.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((client, _)) => {
                        if !u.load(Ordering::Relaxed) {
                            drop(client);
                            continue;
                        }
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(target) else {
                            continue;
                        };
                        c.lock().unwrap().push(client.try_clone().unwrap());
                        c.lock().unwrap().push(server.try_clone().unwrap());
                        for (mut a, mut b) in [
                            (client.try_clone().unwrap(), server.try_clone().unwrap()),
                            (server, client),
                        ] {
                            std::thread::spawn(move || {
                                let _ = std::io::copy(&mut a, &mut b);
                                let _ = b.shutdown(std::net::Shutdown::Both);
                                let _ = a.shutdown(std::net::Shutdown::Both);
                            });
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy {
            port,
            up,
            conns,
            stop,
            thread: Some(thread),
        }
    }

    /// Cut the link: reset every connection, refuse new ones.
    fn cut(&self) {
        self.up.store(false, Ordering::Relaxed);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.up.store(true, Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn free_port() -> std::net::SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[test]
fn a_short_cut_is_reconnected_and_requests_in_flight_are_retried() {
    let addr = free_port();
    let srv = MemServer::start(Arc::new(MemBackend::new(4 << 20)), Listen::Tcp(addr));
    let proxy = Proxy::start(addr);
    let uri = format!("nbd://127.0.0.1:{}/disk", proxy.port);
    let remote = RemoteDev::open(&uri, opts()).unwrap();
    let dev: Arc<dyn BlockDev> = remote.clone();
    let a = pattern(3, 512 << 10);
    write(&dev, 0, &a, false).unwrap();
    // Cut the link with writes in flight; restore it well within give_up.
    let writer = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            let mut errors = 0;
            for i in 0..64u64 {
                let d = pattern(i as u8, 16384);
                if write(&dev, (1 << 20) + i * 16384, &d, false).is_err() {
                    errors += 1;
                }
            }
            errors
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    proxy.cut();
    std::thread::sleep(Duration::from_millis(300));
    proxy.restore();
    assert_eq!(writer.join().unwrap(), 0, "a short cut fails no request");
    assert_eq!(remote.link(), LinkState::Up);
    assert!(remote.stats().reconnects >= 1, "{:?}", remote.stats());
    for i in 0..64u64 {
        assert_eq!(
            read(&dev, (1 << 20) + i * 16384, 16384).unwrap(),
            pattern(i as u8, 16384)
        );
    }
    assert_eq!(&srv.backend.snapshot()[..a.len()], &a[..]);
}

#[test]
fn a_host_gone_for_good_becomes_unreachable_and_is_seen_when_it_returns() {
    let addr = free_port();
    let backend = Arc::new(MemBackend::new(4 << 20));
    let mut srv = MemServer::start(backend.clone(), Listen::Tcp(addr));
    let uri = format!("nbd://127.0.0.1:{}/disk", addr.port());
    let remote = RemoteDev::open(&uri, opts()).unwrap();
    let dev: Arc<dyn BlockDev> = remote.clone();
    write(&dev, 0, &pattern(1, 4096), false).unwrap();
    srv.stop();
    let t = Instant::now();
    let e = write(&dev, 4096, &pattern(2, 4096), false).unwrap_err();
    assert!(dev::is_unreachable(&e), "{e}");
    assert!(
        t.elapsed() >= Duration::from_millis(1000),
        "gave up after {:?}",
        t.elapsed()
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(dev.link_up(), Some(false));
    // Unreachable: requests fail at once now.
    let t = Instant::now();
    assert!(dev::is_unreachable(&read(&dev, 0, 4096).unwrap_err()));
    assert!(t.elapsed() < Duration::from_millis(500));
    // The host comes back (same disk): the member sees it.
    let _srv = MemServer::start(backend, Listen::Tcp(addr));
    let t = Instant::now();
    while dev.link_up() != Some(true) {
        assert!(t.elapsed() < Duration::from_secs(10), "never reconnected");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(read(&dev, 0, 4096).unwrap(), pattern(1, 4096));
}

// ---------------------------------------------------------------- hostile servers

/// How the fake server misbehaves after a correct handshake.
#[derive(Clone, Copy, Debug)]
enum Evil {
    Garbage,
    WrongCookie,
    OversizedChunk,
    ShortRead,
    ChunkOutsideRead,
    OverlappingChunks,
    SimpleReplyWithData,
    Hang,
    HangInHandshake,
    CloseEveryTime,
    /// Correct data, with one byte of the reply's header (28 bytes for a read, 16 for
    /// others) set to a value drawn from the seed: every corruption a header can suffer.
    MutateHeader(u64),
}

fn serve_fake(l: TcpListener, evil: Evil, stop: Arc<AtomicBool>) {
    l.set_nonblocking(true).unwrap();
    while !stop.load(Ordering::Relaxed) {
        let Ok((mut s, _)) = l.accept() else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = fake_conn(&mut s, evil, &stop);
        });
    }
}

fn fake_conn(s: &mut TcpStream, evil: Evil, stop: &AtomicBool) -> std::io::Result<()> {
    if matches!(evil, Evil::HangInHandshake) {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        return Ok(());
    }
    let mut hello = NBDMAGIC.to_be_bytes().to_vec();
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello)?;
    let mut b4 = [0u8; 4];
    s.read_exact(&mut b4)?;
    loop {
        let mut h = [0u8; 16];
        s.read_exact(&mut h)?;
        let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut d = vec![0u8; len as usize];
        s.read_exact(&mut d)?;
        if opt == OPT_GO {
            let mut info = INFO_EXPORT.to_be_bytes().to_vec();
            info.extend_from_slice(&(1u64 << 20).to_be_bytes());
            info.extend_from_slice(&(TF_HAS_FLAGS | TF_SEND_FLUSH | TF_SEND_DF).to_be_bytes());
            s.write_all(&option_reply(opt, REP_INFO, &info))?;
            s.write_all(&option_reply(opt, REP_ACK, &[]))?;
            break;
        }
        s.write_all(&option_reply(opt, REP_ACK, &[]))?;
    }
    if matches!(evil, Evil::CloseEveryTime) {
        return Ok(());
    }
    loop {
        let mut h = [0u8; REQUEST_LEN];
        s.read_exact(&mut h)?;
        let r = parse_request(&h).unwrap();
        let rlen = r.length as u32;
        if r.kind == CMD_WRITE {
            let mut d = vec![0u8; r.length as usize];
            s.read_exact(&mut d)?;
        }
        let data_hdr = |cookie: u64, off: u64, n: u32, flags: u16| {
            let mut v = chunk_header(flags, REPLY_TYPE_OFFSET_DATA, cookie, 8 + n).to_vec();
            v.extend_from_slice(&off.to_be_bytes());
            v
        };
        match evil {
            Evil::Garbage => s.write_all(&[0xa5; 64])?,
            Evil::WrongCookie => s.write_all(&simple_reply_header(0, r.cookie ^ 0xffff))?,
            Evil::OversizedChunk => s.write_all(&chunk_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_OFFSET_DATA,
                r.cookie,
                u32::MAX,
            ))?,
            Evil::ShortRead if r.kind == CMD_READ => {
                // Half the data, then DONE.
                let n = rlen / 2;
                s.write_all(&data_hdr(r.cookie, r.offset, n, 0))?;
                s.write_all(&vec![0xee; n as usize])?;
                s.write_all(&chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, r.cookie, 0))?;
            }
            Evil::ChunkOutsideRead if r.kind == CMD_READ => {
                s.write_all(&data_hdr(r.cookie, r.offset + 4096, rlen, REPLY_FLAG_DONE))?;
                s.write_all(&vec![0xee; r.length as usize])?;
            }
            Evil::OverlappingChunks if r.kind == CMD_READ => {
                s.write_all(&data_hdr(r.cookie, r.offset, rlen, 0))?;
                s.write_all(&vec![0xee; r.length as usize])?;
                s.write_all(&data_hdr(r.cookie, r.offset, 4096, REPLY_FLAG_DONE))?;
                s.write_all(&[0xee; 4096])?;
            }
            Evil::SimpleReplyWithData if r.kind == CMD_READ => {
                s.write_all(&simple_reply_header(0, r.cookie))?;
                s.write_all(&vec![0xee; r.length as usize])?;
            }
            Evil::MutateHeader(seed) => {
                use rand::{Rng, SeedableRng};
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ r.cookie);
                let mut v = if r.kind == CMD_READ {
                    let mut v = data_hdr(r.cookie, r.offset, rlen, REPLY_FLAG_DONE);
                    v.extend_from_slice(&served(r.offset, r.length as usize));
                    v
                } else {
                    simple_reply_header(0, r.cookie).to_vec()
                };
                let hdr = if r.kind == CMD_READ { 28 } else { 16 };
                let at = rng.random_range(0..hdr);
                v[at] = rng.random();
                s.write_all(&v)?;
            }
            Evil::Hang => {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return Ok(());
            }
            _ => s.write_all(&simple_reply_header(0, r.cookie))?,
        }
    }
}

#[test]
fn hostile_servers_fail_the_member_and_never_hand_over_their_bytes() {
    for evil in [
        Evil::Garbage,
        Evil::WrongCookie,
        Evil::OversizedChunk,
        Evil::ShortRead,
        Evil::ChunkOutsideRead,
        Evil::OverlappingChunks,
        Evil::SimpleReplyWithData,
        Evil::Hang,
    ] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let th = std::thread::spawn(move || serve_fake(l, evil, st));
        let uri = format!("nbd://127.0.0.1:{port}/x");
        let dev: Arc<dyn BlockDev> = RemoteDev::open(&uri, opts()).unwrap();
        let t = Instant::now();
        match read(&dev, 0, 8192) {
            Ok(b) => panic!("{evil:?}: a read succeeded with {:?}...", &b[..8]),
            Err(e) => eprintln!("{evil:?}: {e}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{evil:?}: took {:?}",
            t.elapsed()
        );
        // The member is unreachable (failed) rather than retried against the bad server
        // forever; timeouts get there through give_up.
        let t = Instant::now();
        while dev.link_up() != Some(false) {
            assert!(t.elapsed() < Duration::from_secs(10), "{evil:?}: still up");
            std::thread::sleep(Duration::from_millis(20));
        }
        dev.close();
        stop.store(true, Ordering::Relaxed);
        th.join().unwrap();
    }
}

/// What the mutating server's export holds.
fn served(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((offset + i).wrapping_mul(0x9e37_79b9) >> 7) as u8)
        .collect()
}

#[test]
fn a_corrupted_reply_header_never_passes_for_data() {
    let quick = RemoteOptions {
        connections: 1,
        connect_timeout: Duration::from_millis(300),
        io_timeout: Duration::from_millis(300),
        give_up: Duration::from_millis(600),
        read_only: false,
    };
    let (mut ok, mut failed) = (0, 0);
    for seed in 0..24u64 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let th = std::thread::spawn(move || serve_fake(l, Evil::MutateHeader(seed), st));
        let dev: Arc<dyn BlockDev> =
            RemoteDev::open(&format!("nbd://127.0.0.1:{port}/x"), quick.clone()).unwrap();
        let off = 4096 * (seed % 64);
        match read(&dev, off, 8192) {
            // A corruption that leaves the reply meaning the same (a flag the client
            // ignores, a byte rewritten with its own value) may pass, with the right bytes.
            Ok(b) => {
                assert!(b == served(off, 8192), "seed {seed}: wrong bytes accepted");
                ok += 1;
            }
            Err(_) => failed += 1,
        }
        dev.close();
        stop.store(true, Ordering::Relaxed);
        th.join().unwrap();
    }
    eprintln!("{ok} reads passed with the right bytes, {failed} failed");
    assert!(failed > 0, "no corruption was noticed");
}

#[test]
fn servers_that_never_finish_a_handshake_are_refused_in_time() {
    for evil in [Evil::HangInHandshake, Evil::CloseEveryTime] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let th = std::thread::spawn(move || serve_fake(l, evil, st));
        let uri = format!("nbd://127.0.0.1:{port}/x");
        let t = Instant::now();
        match RemoteDev::open(&uri, opts()) {
            Err(e) => eprintln!("{evil:?}: {e}"),
            Ok(dev) => {
                // The handshake went through; the first request must still fail.
                let dev: Arc<dyn BlockDev> = dev;
                assert!(read(&dev, 0, 4096).is_err(), "{evil:?}");
                dev.close();
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{evil:?}: {:?}",
            t.elapsed()
        );
        stop.store(true, Ordering::Relaxed);
        th.join().unwrap();
    }
}

#[test]
fn uris_that_name_nothing_are_clear_errors() {
    for (uri, want) in [
        ("nbd://127.0.0.1:1/x", "127.0.0.1:1"),
        (
            "nbd+unix:///x?socket=/nonexistent/s.sock",
            "/nonexistent/s.sock",
        ),
        ("nbd://h:0/x", "port"),
    ] {
        let e = RemoteDev::open(uri, opts()).err().unwrap().to_string();
        assert!(e.contains(want), "{uri}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let sock: PathBuf = dir.path().join("s.sock");
    let _srv = MemServer::start(
        Arc::new(MemBackend::new(1 << 20)),
        Listen::Unix(sock.clone()),
    );
    let e = RemoteDev::open(
        &format!("nbd+unix:///nope?socket={}", sock.display()),
        opts(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("nope"), "{e}");
}
