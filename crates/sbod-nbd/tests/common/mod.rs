//! Test helpers: an in-process server on a Unix socket, and a small blocking NBD client
//! that speaks the protocol byte by byte (independent of the server's own code paths).

#![allow(dead_code)]

use sbod_nbd::proto::*;
use sbod_nbd::{Listen, MemBackend, Server};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub backend: Arc<MemBackend>,
    pub stats: Arc<sbod_nbd::Stats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start(size: u64) -> TestServer {
        Self::start_with(Arc::new(MemBackend::new(size)))
    }

    pub fn start_with(backend: Arc<MemBackend>) -> TestServer {
        Self::start_exports(vec![("mem", backend)])
    }

    /// A server with several exports; `backend` is the first.
    pub fn start_exports(exports: Vec<(&str, Arc<MemBackend>)>) -> TestServer {
        Self::start_limited(exports, sbod_nbd::Limits::default(), None)
    }

    /// A server within `limits`, on its Unix socket and, if given, a TCP address too.
    pub fn start_limited(
        exports: Vec<(&str, Arc<MemBackend>)>,
        limits: sbod_nbd::Limits,
        tcp: Option<std::net::SocketAddr>,
    ) -> TestServer {
        let backend = exports[0].1.clone();
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = Server::new(
            exports
                .into_iter()
                .map(|(name, b)| (name.to_string(), b))
                .collect(),
        )
        .with_limits(limits);
        let stats = server.stats();
        let s2 = sock.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut listen = vec![Listen::Unix(s2)];
                listen.extend(tcp.map(Listen::Tcp));
                server
                    .serve(listen, async move {
                        let _ = rx.await;
                    })
                    .await
                    .unwrap();
            });
        });
        for _ in 0..200 {
            if UnixStream::connect(&sock).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        TestServer {
            dir,
            sock,
            backend,
            stats,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///mem?socket={}", self.sock.display())
    }

    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

pub struct Client {
    pub s: UnixStream,
    pub structured: bool,
    pub size: u64,
    pub flags: u16,
    cookie: u64,
}

pub fn read_u16(s: &mut impl Read) -> u16 {
    let mut b = [0u8; 2];
    s.read_exact(&mut b).unwrap();
    u16::from_be_bytes(b)
}
pub fn read_u32(s: &mut impl Read) -> u32 {
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    u32::from_be_bytes(b)
}
pub fn read_u64(s: &mut impl Read) -> u64 {
    let mut b = [0u8; 8];
    s.read_exact(&mut b).unwrap();
    u64::from_be_bytes(b)
}

/// Read the server greeting and send client flags.
pub fn greet(s: &mut UnixStream) {
    assert_eq!(read_u64(s), NBDMAGIC);
    assert_eq!(read_u64(s), IHAVEOPT);
    let f = read_u16(s);
    assert!(f & FLAG_FIXED_NEWSTYLE != 0);
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
}

pub fn send_option(s: &mut UnixStream, opt: u32, data: &[u8]) {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    s.write_all(&v).unwrap();
}

/// (reply type, data)
pub fn read_option_reply(s: &mut UnixStream, opt: u32) -> (u32, Vec<u8>) {
    assert_eq!(read_u64(s), OPT_REPLY_MAGIC);
    assert_eq!(read_u32(s), opt);
    let kind = read_u32(s);
    let len = read_u32(s) as usize;
    let mut d = vec![0u8; len];
    s.read_exact(&mut d).unwrap();
    (kind, d)
}

impl Client {
    pub fn from_stream(s: UnixStream, structured: bool, size: u64) -> Client {
        Client {
            s,
            structured,
            size,
            flags: 0,
            cookie: 1,
        }
    }

    /// Handshake with GO (asking for block sizes); optionally structured replies.
    pub fn connect(sock: &std::path::Path, structured: bool) -> Client {
        let mut s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        greet(&mut s);
        if structured {
            send_option(&mut s, OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(read_option_reply(&mut s, OPT_STRUCTURED_REPLY).0, REP_ACK);
        }
        let req = encode_info_request(&InfoRequest {
            name: String::new(),
            requests: vec![INFO_BLOCK_SIZE],
        });
        send_option(&mut s, OPT_GO, &req);
        let (mut size, mut flags) = (0, 0);
        loop {
            let (kind, d) = read_option_reply(&mut s, OPT_GO);
            match kind {
                REP_INFO => {
                    if u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT {
                        size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                        flags = u16::from_be_bytes([d[10], d[11]]);
                    }
                }
                REP_ACK => break,
                k => panic!("GO failed with reply {k:#x}"),
            }
        }
        Client {
            s,
            structured,
            size,
            flags,
            cookie: 1,
        }
    }

    pub fn send(&mut self, kind: u16, flags: u16, offset: u64, length: u32, payload: &[u8]) -> u64 {
        self.cookie += 1;
        let r = Request {
            flags,
            kind,
            cookie: self.cookie,
            offset,
            length: length as u64,
        };
        let mut v = encode_request(&r).to_vec();
        v.extend_from_slice(payload);
        self.s.write_all(&v).unwrap();
        self.cookie
    }

    /// Read one complete reply: (cookie, error, data).
    pub fn reply(&mut self, read_len: usize) -> (u64, u32, Vec<u8>) {
        let magic = read_u32(&mut self.s);
        if magic == SIMPLE_REPLY_MAGIC {
            let error = read_u32(&mut self.s);
            let cookie = read_u64(&mut self.s);
            let mut d = vec![0u8; if error == 0 { read_len } else { 0 }];
            self.s.read_exact(&mut d).unwrap();
            return (cookie, error, d);
        }
        assert_eq!(magic, STRUCTURED_REPLY_MAGIC, "bad reply magic");
        let flags = read_u16(&mut self.s);
        let kind = read_u16(&mut self.s);
        let cookie = read_u64(&mut self.s);
        let len = read_u32(&mut self.s) as usize;
        let mut d = vec![0u8; len];
        self.s.read_exact(&mut d).unwrap();
        assert!(flags & REPLY_FLAG_DONE != 0, "server split a reply");
        match kind {
            REPLY_TYPE_OFFSET_DATA => (cookie, 0, d[8..].to_vec()),
            REPLY_TYPE_ERROR => (
                cookie,
                u32::from_be_bytes(d[0..4].try_into().unwrap()),
                vec![],
            ),
            REPLY_TYPE_NONE => (cookie, 0, vec![]),
            k => panic!("unexpected chunk type {k}"),
        }
    }

    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> u32 {
        let c = self.send(
            CMD_WRITE,
            if fua { CMD_FLAG_FUA } else { 0 },
            offset,
            data.len() as u32,
            data,
        );
        let (cookie, err, _) = self.reply(0);
        assert_eq!(cookie, c);
        err
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        let c = self.send(CMD_READ, 0, offset, len, &[]);
        let (cookie, err, d) = self.reply(len as usize);
        assert_eq!(cookie, c);
        if err == 0 {
            Ok(d)
        } else {
            Err(err)
        }
    }

    pub fn simple(&mut self, kind: u16, flags: u16, offset: u64, len: u32) -> u32 {
        let c = self.send(kind, flags, offset, len, &[]);
        let (cookie, err, _) = self.reply(0);
        assert_eq!(cookie, c);
        err
    }

    pub fn disconnect(mut self) {
        self.send(CMD_DISC, 0, 0, 0, &[]);
    }
}

pub fn need(tool: &str) {
    let ok = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "{tool} is not installed: run scripts/deps.sh (it installs fio, libnbd-bin, qemu-utils, nbdkit)");
}
