//! An in-process target on an in-memory volume, on 127.0.0.1 with an ephemeral port, and
//! helpers to run the real initiators (libiscsi's tools, qemu-img) against it.
#![allow(dead_code)]

use sbod_iscsi::{Chap, Limits, Lu, LuConfig, Server, Stats, Target};
use sbod_nbd::MemBackend;
use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::Arc;

pub const IQN: &str = "iqn.2025-01.io.sbod:test";

pub struct Running {
    pub addr: SocketAddr,
    pub backend: Arc<MemBackend>,
    pub stats: Arc<Stats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    pub fn url(&self) -> String {
        format!("iscsi://{}/{IQN}/0", self.addr)
    }
    pub fn url_with(&self, creds: &str, args: &str) -> String {
        format!("iscsi://{creds}@{}/{IQN}/0{args}", self.addr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().expect("the server thread panicked");
        }
    }
}

pub struct Opts {
    pub size: u64,
    pub block_size: u32,
    pub chap: Option<Chap>,
    pub initiators: Vec<String>,
    pub limits: Limits,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            size: 64 << 20,
            block_size: 512,
            chap: None,
            initiators: vec![],
            limits: Limits::default(),
        }
    }
}

pub fn start(o: Opts) -> Running {
    let backend = Arc::new(MemBackend::new(o.size));
    let lu = Arc::new(Lu::new(
        backend.clone(),
        LuConfig {
            block_size: o.block_size,
            serial: "test0001".into(),
            vendor: "SBOD".into(),
            product: "sbod test".into(),
        },
        IQN,
    ));
    let server = Server::new(vec![Target {
        iqn: IQN.into(),
        alias: Some("test".into()),
        lu,
        chap: o.chap,
        initiators: o.initiators,
    }])
    .with_limits(o.limits);
    let stats = server.stats();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (atx, arx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let bound = server
                .bind(&["127.0.0.1:0".parse().unwrap()])
                .await
                .unwrap();
            atx.send(bound.local_addrs()[0]).unwrap();
            bound
                .serve(async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
    });
    let addr = arx.recv().unwrap();
    Running {
        addr,
        backend,
        stats,
        stop: Some(tx),
        thread: Some(thread),
    }
}

pub fn need(tool: &str, pkg: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{tool} is not installed: run scripts/deps.sh (Debian package {pkg})"
    );
}

pub fn run(c: &mut Command) -> Output {
    let o = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    o
}

pub fn ok(c: &mut Command) -> String {
    let o = run(c);
    assert!(
        o.status.success(),
        "{c:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Deterministic bytes for a test image.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| ((i ^ seed).wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}
