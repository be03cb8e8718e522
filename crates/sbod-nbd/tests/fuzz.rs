//! Fuzzing the handshake and request parsing through a real socket: proptest builds
//! sessions a client could send (greeting flags, options, requests with payloads) and
//! mutates them (flipped, inserted and cut bytes, lying lengths). Whatever arrives, the
//! server must not panic, must not hang (it answers or closes, and closes once the client
//! has hung up), must not touch an export the session never named, and must go on serving
//! a well-behaved client.
//!
//! Bounded for CI; `SBOD_FUZZ_CASES` multiplies the cases. With `SBOD_TORTURE_REPORT` set,
//! one JSON line of figures is appended to that file (docs/RELIABILITY.md).

use crate::common;
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use sbod_nbd::proto::*;
use sbod_nbd::MemBackend;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SIZE: u64 = 1 << 20;

#[derive(Clone, Debug)]
enum Opt {
    Structured,
    List,
    Info {
        name: String,
        reqs: Vec<u16>,
    },
    StartTls,
    /// NBD_OPT_EXTENDED_HEADERS: the requests then go with extended headers.
    Extended,
    /// LIST_META_CONTEXT (`set` false) or SET_META_CONTEXT.
    Meta {
        set: bool,
        name: String,
        queries: Vec<String>,
    },
    Unknown {
        opt: u32,
        data: Vec<u8>,
    },
    /// A header whose length is not what follows.
    Lying {
        opt: u32,
        len: u32,
        data: Vec<u8>,
    },
}

#[derive(Clone, Debug)]
enum Finish {
    Go(String),
    ExportName(String),
    Abort,
    Nothing,
}

#[derive(Clone, Debug)]
struct Req {
    kind: u16,
    flags: u16,
    offset: u64,
    length: u32,
    /// Payload actually sent (for writes; may differ from `length`).
    payload: usize,
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Cut(usize),
}

#[derive(Clone, Debug)]
struct Session {
    client_flags: u32,
    opts: Vec<Opt>,
    finish: Finish,
    reqs: Vec<Req>,
    mutations: Vec<Mutation>,
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("mem".to_string()),
        1 => Just(String::new()),
        1 => "[a-z]{0,6}",
        1 => Just("\u{0}\u{ff}".to_string()),
    ]
}

fn opt() -> impl Strategy<Value = Opt> {
    prop_oneof![
        Just(Opt::Structured),
        Just(Opt::List),
        (
            name(),
            proptest::collection::vec(prop_oneof![0u16..4, any::<u16>()], 0..4)
        )
            .prop_map(|(name, reqs)| Opt::Info { name, reqs }),
        Just(Opt::StartTls),
        Just(Opt::Extended),
        (
            any::<bool>(),
            name(),
            proptest::collection::vec(
                prop_oneof![
                    3 => Just("base:allocation".to_string()),
                    1 => Just("base:".to_string()),
                    1 => "[a-z:]{0,12}",
                ],
                0..3
            )
        )
            .prop_map(|(set, name, queries)| Opt::Meta { set, name, queries }),
        (12u32..40, proptest::collection::vec(any::<u8>(), 0..32))
            .prop_map(|(opt, data)| Opt::Unknown { opt, data }),
        (
            1u32..10,
            prop_oneof![0u32..64, Just(MAX_OPTION_LEN + 1), Just(u32::MAX)],
            proptest::collection::vec(any::<u8>(), 0..16)
        )
            .prop_map(|(opt, len, data)| Opt::Lying { opt, len, data }),
    ]
}

fn finish() -> impl Strategy<Value = Finish> {
    prop_oneof![
        4 => name().prop_map(Finish::Go),
        2 => name().prop_map(Finish::ExportName),
        1 => Just(Finish::Abort),
        1 => Just(Finish::Nothing),
    ]
}

fn req() -> impl Strategy<Value = Req> {
    let kind = prop_oneof![
        3 => Just(CMD_READ),
        3 => Just(CMD_WRITE),
        1 => Just(CMD_FLUSH),
        1 => Just(CMD_TRIM),
        1 => Just(CMD_WRITE_ZEROES),
        1 => Just(CMD_DISC),
        1 => Just(CMD_CACHE),
        2 => Just(CMD_BLOCK_STATUS),
        1 => 8u16..64,
    ];
    let offset = prop_oneof![
        4 => (0..SIZE / 4096).prop_map(|b| b * 4096),
        1 => 0..SIZE + 8192,
        1 => Just(SIZE),
        1 => any::<u64>(),
    ];
    let length = prop_oneof![
        4 => (1u32..5).prop_map(|n| n * 4096),
        1 => 0u32..9000,
        1 => Just(33 << 20),
        1 => any::<u32>(),
    ];
    (
        kind,
        prop_oneof![3 => Just(0u16), 1 => 0u16..8, 1 => any::<u16>()],
        offset,
        length,
        any::<u16>(),
    )
        .prop_map(|(kind, flags, offset, length, r)| Req {
            kind,
            flags,
            offset,
            length,
            payload: if kind == CMD_WRITE {
                match r % 8 {
                    // Short by a little: the next header is read as payload.
                    0 => (length as usize)
                        .min(16384)
                        .saturating_sub(r as usize % 100),
                    _ => (length as usize).min(16384),
                }
            } else {
                0
            },
        })
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..24)
        )
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Cut),
    ]
}

fn session() -> impl Strategy<Value = Session> {
    (
        prop_oneof![
            6 => Just(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES),
            1 => Just(FLAG_C_FIXED_NEWSTYLE),
            1 => any::<u32>(),
        ],
        proptest::collection::vec(opt(), 0..4),
        finish(),
        proptest::collection::vec(req(), 0..8),
        prop_oneof![
            2 => Just(vec![]),
            3 => proptest::collection::vec(mutation(), 1..4),
        ],
    )
        .prop_map(|(client_flags, opts, finish, reqs, mutations)| Session {
            client_flags,
            opts,
            finish,
            reqs,
            mutations,
        })
}

fn option(v: &mut Vec<u8>, opt: u32, data: &[u8]) {
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
}

/// The bytes the client sends after reading the server's greeting.
fn bytes(s: &Session) -> Vec<u8> {
    let mut v = s.client_flags.to_be_bytes().to_vec();
    for o in &s.opts {
        match o {
            Opt::Structured => option(&mut v, OPT_STRUCTURED_REPLY, &[]),
            Opt::List => option(&mut v, OPT_LIST, &[]),
            Opt::StartTls => option(&mut v, OPT_STARTTLS, &[]),
            Opt::Extended => option(&mut v, OPT_EXTENDED_HEADERS, &[]),
            Opt::Meta { set, name, queries } => option(
                &mut v,
                if *set {
                    OPT_SET_META_CONTEXT
                } else {
                    OPT_LIST_META_CONTEXT
                },
                &encode_meta_request(&MetaRequest {
                    name: name.clone(),
                    queries: queries.clone(),
                }),
            ),
            Opt::Info { name, reqs } => option(
                &mut v,
                OPT_INFO,
                &encode_info_request(&InfoRequest {
                    name: name.clone(),
                    requests: reqs.clone(),
                }),
            ),
            Opt::Unknown { opt, data } => option(&mut v, *opt, data),
            Opt::Lying { opt, len, data } => {
                v.extend_from_slice(&IHAVEOPT.to_be_bytes());
                v.extend_from_slice(&opt.to_be_bytes());
                v.extend_from_slice(&len.to_be_bytes());
                v.extend_from_slice(data);
            }
        }
    }
    match &s.finish {
        Finish::Go(name) => option(
            &mut v,
            OPT_GO,
            &encode_info_request(&InfoRequest {
                name: name.clone(),
                requests: vec![INFO_BLOCK_SIZE],
            }),
        ),
        Finish::ExportName(name) => option(&mut v, OPT_EXPORT_NAME, name.as_bytes()),
        Finish::Abort => option(&mut v, OPT_ABORT, &[]),
        Finish::Nothing => {}
    }
    let extended = s.opts.iter().any(|o| matches!(o, Opt::Extended));
    for (i, r) in s.reqs.iter().enumerate() {
        let mut q = Request {
            flags: r.flags,
            kind: r.kind,
            cookie: i as u64 + 1,
            offset: r.offset,
            length: r.length as u64,
        };
        if extended {
            if r.kind == CMD_WRITE {
                q.flags |= CMD_FLAG_PAYLOAD_LEN;
            }
            v.extend_from_slice(&encode_extended_request(&q));
        } else {
            v.extend_from_slice(&encode_request(&q));
        }
        v.extend((0..r.payload).map(|j| (i * 31 + j) as u8));
    }
    for m in &s.mutations {
        if v.is_empty() {
            break;
        }
        match m {
            Mutation::Flip(i, x) => {
                let n = v.len();
                v[i % n] ^= x;
            }
            Mutation::Insert(i, b) => {
                let at = i % (v.len() + 1);
                v.splice(at..at, b.iter().copied());
            }
            Mutation::Cut(i) => {
                let n = v.len();
                v.truncate(i % n);
            }
        }
    }
    v
}

#[derive(Default)]
struct Figures {
    sessions: AtomicU64,
    mutated: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_answered: AtomicU64,
}

/// Play one session; the server must answer what it answers and close once we hang up.
fn play(sock: &std::path::Path, s: &Session, fig: &Figures) -> Result<(), TestCaseError> {
    let mut c =
        UnixStream::connect(sock).map_err(|e| TestCaseError::fail(format!("connect: {e}")))?;
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut greeting = [0u8; 18];
    c.read_exact(&mut greeting)
        .map_err(|e| TestCaseError::fail(format!("no greeting: {e}")))?;
    prop_assert_eq!(&greeting[..8], &NBDMAGIC.to_be_bytes()[..]);
    let data = bytes(s);
    fig.sessions.fetch_add(1, Ordering::Relaxed);
    if !s.mutations.is_empty() {
        fig.mutated.fetch_add(1, Ordering::Relaxed);
    }
    fig.bytes_sent
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    // Send from another thread: the server may stop reading (and close) at any point.
    let mut w = c.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let _ = w.write_all(&data);
        let _ = w.shutdown(std::net::Shutdown::Write);
    });
    let mut got = 0u64;
    let mut b = vec![0u8; 64 << 10];
    let r = loop {
        match c.read(&mut b) {
            Ok(0) => break Ok(()),
            Ok(n) => got += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    sender.join().unwrap();
    fig.bytes_answered.fetch_add(got, Ordering::Relaxed);
    prop_assert!(
        r.is_ok(),
        "the server neither answered nor closed within 20 s of the client hanging up: {:?}",
        r
    );
    Ok(())
}

#[test]
fn fuzzed_sessions_harm_nothing() {
    let mul: u32 = std::env::var("SBOD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let cases = 300 * mul.max(1);
    // A panic anywhere in the server (its tasks run on other threads) counts.
    let panics = Arc::new(AtomicU64::new(0));
    let p2 = panics.clone();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        p2.fetch_add(1, Ordering::Relaxed);
        default_hook(info);
    }));

    let fuzzed = Arc::new(MemBackend::new(SIZE));
    let guard = Arc::new(MemBackend::new(SIZE));
    let mut srv =
        TestServer::start_exports(vec![("mem", fuzzed.clone()), ("guard", guard.clone())]);
    let sock = srv.sock.clone();

    let fig = Figures::default();
    let mut runner = TestRunner::new(Config {
        cases,
        // A failure found once is kept (next to this file) and tried first on every run.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        source_file: Some(file!()),
        ..Config::default()
    });
    let r = runner.run(&session(), |s| play(&sock, &s, &fig));

    // A well-behaved client is served as ever.
    let mut c = Client::connect(&sock, true);
    let data: Vec<u8> = (0..8192).map(|i| (i * 7) as u8).collect();
    assert_eq!(c.write(0, &data, true), 0);
    assert_eq!(c.read(0, 8192).unwrap(), data);
    c.disconnect();
    srv.stop();
    let _ = std::panic::take_hook();

    r.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        panics.load(Ordering::Relaxed),
        0,
        "the server panicked (see above)"
    );
    assert!(
        guard.snapshot().iter().all(|&b| b == 0),
        "an export no session named was written"
    );
    // The generator is worth something only if sessions get through the handshake.
    let written = fuzzed
        .snapshot()
        .chunks(4096)
        .skip(2)
        .filter(|b| b.iter().any(|&x| x != 0))
        .count();
    assert!(
        written > 0,
        "no fuzzed session wrote anything: the fuzzer never reaches transmission"
    );

    let v = format!(
        "{{\"suite\":\"nbd-fuzz\",\"sessions\":{},\"mutated\":{},\"bytes_sent\":{},\"bytes_answered\":{},\"panics\":0,\"hangs\":0}}",
        fig.sessions.load(Ordering::Relaxed),
        fig.mutated.load(Ordering::Relaxed),
        fig.bytes_sent.load(Ordering::Relaxed),
        fig.bytes_answered.load(Ordering::Relaxed)
    );
    println!("torture figures: {v}");
    if let Ok(p) = std::env::var("SBOD_TORTURE_REPORT") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .expect("open the report file");
        writeln!(f, "{v}").expect("write the report");
    }
}
