//! sbod's codec side by side with Intel ISA-L and klauspost/reedsolomon, in one run, on
//! the same buffers (the same layout, shard skew and working sets) and the same clock
//! (the measuring thread's CPU time; the build machines are shared and noisy).
//!
//! Before measuring it checks that sbod's output is byte-identical to ISA-L's: Cauchy
//! parity to `ec_encode_data` with `gf_gen_cauchy1_matrix`, P+Q to `pq_gen`, XOR to
//! `xor_gen` (an independent check of the on-disk format).
//!
//! Usage: see scripts/bench-codec.sh.

use sbod_codec::bench::{self, Case, Meter, Op, Pool, Rate, Timing, WorkingSet};
use sbod_codec::{Codec, Isa, Scheme};
use serde::{Deserialize, Serialize};
use std::ffi::{c_int, c_uchar, c_void};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

#[link(name = "isal")]
extern "C" {
    fn xor_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    fn pq_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    fn gf_gen_cauchy1_matrix(a: *mut c_uchar, m: c_int, k: c_int);
    fn ec_init_tables(k: c_int, rows: c_int, a: *mut c_uchar, gftbls: *mut c_uchar);
    fn ec_encode_data(
        len: c_int,
        k: c_int,
        rows: c_int,
        gftbls: *mut c_uchar,
        data: *mut *mut c_uchar,
        coding: *mut *mut c_uchar,
    );
    fn gf_invert_matrix(inp: *mut c_uchar, out: *mut c_uchar, n: c_int) -> c_int;
}

/// ISA-L's Cauchy encode matrix ((k+m) x k, identity on top).
fn isal_matrix(k: usize, m: usize) -> Vec<u8> {
    let mut a = vec![0u8; (k + m) * k];
    // SAFETY: a has (k+m)*k bytes.
    unsafe { gf_gen_cauchy1_matrix(a.as_mut_ptr(), (k + m) as c_int, k as c_int) };
    a
}

fn init_tables(k: usize, rows: usize, coef: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; k * rows * 32];
    let mut c = coef.to_vec();
    // SAFETY: c has rows*k coefficients, t has k*rows*32 bytes.
    unsafe { ec_init_tables(k as c_int, rows as c_int, c.as_mut_ptr(), t.as_mut_ptr()) };
    t
}

/// The ISA-L decode matrix rows for the first `lost` data shards, from the first k
/// survivors (shards lost..lost+k): invert the survivors' rows, keep the lost rows.
fn isal_decode_rows(k: usize, m: usize, lost: usize) -> Vec<u8> {
    let a = isal_matrix(k, m);
    let mut b: Vec<u8> = a[lost * k..(lost + k) * k].to_vec();
    let mut d = vec![0u8; k * k];
    // SAFETY: b and d are k x k.
    let r = unsafe { gf_invert_matrix(b.as_mut_ptr(), d.as_mut_ptr(), k as c_int) };
    assert_eq!(r, 0, "ISA-L found the survivor matrix singular");
    d[..lost * k].to_vec()
}

/// One ISA-L call for `case` on stripe pointers `p` (k data, then m parity).
struct IsalOp {
    case: Case,
    k: usize,
    tables: Vec<u8>,
    rows: usize,
}

impl IsalOp {
    fn new(case: Case) -> Option<IsalOp> {
        let (k, m) = (case.scheme.k(), case.scheme.m());
        let (tables, rows) = match (case.scheme, case.op) {
            (Scheme::Xor { .. }, Op::Encode) | (Scheme::PQ { .. }, Op::Encode) => (Vec::new(), m),
            (Scheme::Cauchy { .. }, Op::Encode) => {
                (init_tables(k, m, &isal_matrix(k, m)[k * k..]), m)
            }
            (Scheme::Cauchy { .. }, Op::Decode { lost }) => {
                (init_tables(k, lost, &isal_decode_rows(k, m, lost)), lost)
            }
            _ => return None,
        };
        Some(IsalOp {
            case,
            k,
            tables,
            rows,
        })
    }

    /// Run on a stripe whose shard pointers are `p`, each `len` bytes.
    fn call(&mut self, p: &mut [*mut u8], len: usize) {
        let k = self.k;
        // SAFETY: p holds k+m shard pointers of len bytes each (32-byte aligned: the
        // StripeSet layout), the tables match k and rows.
        unsafe {
            match (self.case.scheme, self.case.op) {
                (Scheme::Xor { .. }, _) => {
                    assert_eq!(
                        xor_gen((k + 1) as c_int, len as c_int, p.as_mut_ptr() as _),
                        0
                    );
                }
                (Scheme::PQ { .. }, _) => {
                    assert_eq!(
                        pq_gen((k + 2) as c_int, len as c_int, p.as_mut_ptr() as _),
                        0
                    );
                }
                (_, Op::Decode { lost }) => {
                    let (outs, srcs) = p.split_at_mut(lost);
                    ec_encode_data(
                        len as c_int,
                        k as c_int,
                        lost as c_int,
                        self.tables.as_mut_ptr(),
                        srcs.as_mut_ptr(),
                        outs.as_mut_ptr(),
                    );
                }
                _ => {
                    let (data, par) = p.split_at_mut(k);
                    ec_encode_data(
                        len as c_int,
                        k as c_int,
                        self.rows as c_int,
                        self.tables.as_mut_ptr(),
                        data.as_mut_ptr(),
                        par.as_mut_ptr(),
                    );
                }
            }
        }
    }
}

/// sbod's parity must equal ISA-L's byte for byte (and decodes must give the data back).
fn check_identity(isa: Isa) -> Result<(), String> {
    let len = 8192 + 64;
    let mut pool = Pool::new();
    for (scheme, op) in [
        (Scheme::Xor { k: 7 }, Op::Encode),
        (Scheme::PQ { k: 8 }, Op::Encode),
        (Scheme::PQ { k: 30 }, Op::Encode),
        (Scheme::Cauchy { k: 10, m: 2 }, Op::Encode),
        (Scheme::Cauchy { k: 10, m: 4 }, Op::Encode),
        (Scheme::Cauchy { k: 16, m: 4 }, Op::Encode),
        (Scheme::Cauchy { k: 12, m: 9 }, Op::Encode),
    ] {
        let codec = Codec::with_isa(scheme, isa).map_err(|e| e.to_string())?;
        let (k, m) = (scheme.k(), scheme.m());
        if let Scheme::Cauchy { .. } = scheme {
            if codec.generator_matrix() != isal_matrix(k, m) {
                return Err(format!(
                    "{scheme}: generator matrix differs from gf_gen_cauchy1_matrix"
                ));
            }
        }
        // Two copies of the same random stripe: one for each codec.
        let mut set = pool.stripes(2, k + m, len, 128);
        let src: Vec<Vec<u8>> = set.stripe(0)[..k].iter().map(|s| s.to_vec()).collect();
        for (d, s) in set.stripe(1).iter_mut().zip(&src) {
            d.copy_from_slice(s);
        }
        {
            let mut s = set.stripe(0);
            let (data, par) = s.split_at_mut(k);
            let data: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
            codec.encode(&data, par).map_err(|e| e.to_string())?;
        }
        let mut op = IsalOp::new(Case { scheme, op }).expect("an ISA-L encode");
        op.call(&mut set.ptrs(1), len);
        let (a, b) = (
            set.stripe(0).iter().map(|s| s.to_vec()).collect::<Vec<_>>(),
            set.stripe(1).iter().map(|s| s.to_vec()).collect::<Vec<_>>(),
        );
        if a != b {
            return Err(format!("{scheme}: sbod parity differs from ISA-L's"));
        }
        // Decodes: both rebuild the first 1 and 2 data shards.
        if let Scheme::Cauchy { .. } = scheme {
            for lost in 1..=2 {
                let mut op = IsalOp::new(Case {
                    scheme,
                    op: Op::Decode { lost },
                })
                .expect("a decode");
                for s in set.stripe(1)[..lost].iter_mut() {
                    s.fill(0);
                }
                op.call(&mut set.ptrs(1), len);
                let mut s = set.stripe(0);
                for sh in s[..lost].iter_mut() {
                    sh.fill(0);
                }
                let present: Vec<bool> = (0..k + m).map(|i| i >= lost).collect();
                codec
                    .reconstruct(&mut s, &present)
                    .map_err(|e| e.to_string())?;
                for (i, orig) in src.iter().enumerate().take(lost) {
                    if *set.stripe(0)[i] != orig[..] || *set.stripe(1)[i] != orig[..] {
                        return Err(format!(
                            "{scheme}: decode of {lost} lost did not restore shard {i}"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The klauspost benchmark process: one request line, one measuring round.
struct Klauspost {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

#[derive(Serialize)]
struct GoRequest {
    k: usize,
    m: usize,
    op: String,
    shard_bytes: usize,
    stream_bytes: usize,
    skew: usize,
    budget_us: u128,
}

#[derive(Deserialize)]
struct GoReply {
    gbps: f64,
    wall_gbps: f64,
    #[serde(default)]
    error: Option<String>,
}

impl Klauspost {
    fn spawn(bin: &PathBuf) -> Klauspost {
        let mut child = Command::new(bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Klauspost {
            _child: child,
            stdin,
            stdout,
        }
    }

    /// The request for a row, or None where klauspost has no such operation.
    fn request(
        case: &Case,
        shard: usize,
        stream_bytes: usize,
        skew: usize,
        t: Timing,
    ) -> Option<GoRequest> {
        let Scheme::Cauchy { k, m } = case.scheme else {
            return None;
        };
        let op = match case.op {
            Op::Encode => "encode".to_string(),
            Op::Decode { lost } => format!("decode{lost}"),
            _ => return None,
        };
        Some(GoRequest {
            k,
            m,
            op,
            shard_bytes: shard,
            stream_bytes,
            skew,
            budget_us: t.budget.as_micros(),
        })
    }

    fn round(&mut self, req: &GoRequest) -> (f64, f64) {
        let mut line = serde_json::to_string(req).expect("serialisable");
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .expect("klauspost benchmark alive");
        let mut reply = String::new();
        self.stdout
            .read_line(&mut reply)
            .expect("klauspost benchmark alive");
        let r: GoReply = serde_json::from_str(&reply)
            .unwrap_or_else(|e| panic!("klauspost reply {reply:?}: {e}"));
        if let Some(e) = r.error {
            panic!("klauspost benchmark: {e}");
        }
        (r.gbps, r.wall_gbps)
    }
}

#[derive(Serialize)]
struct Row {
    case: String,
    shard_bytes: usize,
    working_set: WorkingSet,
    working_set_bytes: usize,
    sbod: Rate,
    isal: Option<Rate>,
    klauspost: Option<Rate>,
    sbod_vs_isal: Option<f64>,
    sbod_vs_klauspost: Option<f64>,
    sbod_pct_of_ceiling: Option<f64>,
    best_peer_pct_of_ceiling: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    cpu: String,
    isa: Isa,
    clock: &'static str,
    skew: usize,
    ceiling: bench::Ceiling,
    isal_decode_setup_us: f64,
    rows: Vec<Row>,
}

fn main() {
    let mut json = false;
    let mut json_out: Option<PathBuf> = None;
    let mut timing = Timing {
        budget: Duration::from_millis(15),
        rounds: 5,
    };
    let mut stream_bytes = 256usize << 20;
    let mut skew = 128;
    let mut isa = Isa::selected();
    let mut go: Option<PathBuf> = None;
    let mut filter: Option<String> = None;
    let mut sizes = vec![4096, 65536, 1 << 20];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--json" => json = true,
            "--json-out" => json_out = Some(PathBuf::from(val())),
            "--long" => {
                timing = Timing {
                    budget: Duration::from_millis(50),
                    rounds: 9,
                }
            }
            "--stream-mib" => stream_bytes = val().parse::<usize>().expect("MiB") << 20,
            "--skew" => skew = val().parse().expect("bytes"),
            "--isa" => isa = val().parse().expect("an ISA name"),
            "--klauspost" => go = Some(PathBuf::from(val())),
            "--filter" => filter = Some(val()),
            "--sizes" => {
                sizes = val()
                    .split(',')
                    .map(|s| s.parse().expect("bytes"))
                    .collect()
            }
            _ => panic!("unknown argument {a}"),
        }
    }
    if let Err(e) = check_identity(isa) {
        eprintln!("IDENTITY CHECK FAILED: {e}");
        std::process::exit(1);
    }
    eprintln!("identity: sbod ({isa}) parity is byte-identical to ISA-L's ec_encode_data (Cauchy), pq_gen and xor_gen");

    let mut cases = Case::peer();
    if let Some(f) = &filter {
        cases.retain(|c| c.name().contains(f.as_str()));
    }

    let mut pool = Pool::new();
    let ceiling = bench::memory_ceiling(&mut pool, stream_bytes / 2, timing, isa);
    // ISA-L's decode setup per erasure pattern (what sbod's plan cache saves).
    let isal_decode_setup_us = {
        let r = bench::measure(timing, 1, 1, false, |_| {
            let rows = isal_decode_rows(10, 4, 2);
            std::hint::black_box(init_tables(10, 2, &rows));
        });
        1e-3 / r.gbps
    };

    let mut kp = go.as_ref().map(Klauspost::spawn);
    // Separate buffers for sbod and ISA-L (klauspost has its own), so that each can hold
    // its prepared calls across the interleaved rounds.
    let mut isal_pool = Pool::new();
    let mut rows = Vec::new();
    for case in &cases {
        let codec = Codec::with_isa(case.scheme, isa).expect("supported");
        let mut isal = IsalOp::new(*case);
        let n = case.scheme.k() + case.scheme.m();
        for &shard in &sizes {
            for ws in [WorkingSet::Cache, WorkingSet::Stream] {
                let bytes = if ws == WorkingSet::Stream {
                    stream_bytes
                } else {
                    0
                };
                let per_call = case.data_bytes(shard);
                let mut set = bench::case_stripes(&mut pool, &codec, case, shard, bytes, skew);
                let (stripes, set_bytes) = (set.stripes, set.bytes());
                let mut sbod =
                    Meter::new(per_call, false, bench::sbod_call(&codec, case, &mut set, 1));
                sbod.warm(stripes.min(2));
                let mut iset = isal_pool.stripes_for(bytes, 1, n, shard, skew);
                let mut ptrs: Vec<Vec<*mut u8>> = (0..stripes).map(|i| iset.ptrs(i)).collect();
                let mut isal_m = isal.as_mut().map(|op| {
                    Meter::new(per_call, false, move |i| {
                        op.call(&mut ptrs[i % stripes], shard)
                    })
                });
                if let Some(m) = isal_m.as_mut() {
                    m.warm(stripes.min(2));
                }
                let req = kp
                    .as_ref()
                    .and(Klauspost::request(case, shard, bytes, skew, timing));
                let (mut kcpu, mut kwall) = (Vec::new(), Vec::new());
                // Take turns, round by round, starting with a different codec each round.
                for r in 0..timing.rounds {
                    for turn in 0..3 {
                        match (r + turn) % 3 {
                            0 => {
                                sbod.round(timing.budget);
                            }
                            1 => {
                                if let Some(m) = isal_m.as_mut() {
                                    m.round(timing.budget);
                                }
                            }
                            _ => {
                                if let (Some(k), Some(req)) = (kp.as_mut(), req.as_ref()) {
                                    let (c, w) = k.round(req);
                                    kcpu.push(c);
                                    kwall.push(w);
                                }
                            }
                        }
                    }
                }
                let sbod = sbod.rate();
                let isal_rate = isal_m.map(|m| m.rate());
                let kp_rate = req.map(|_| Rate::from_rounds(&kcpu, &kwall));
                let pct = |g: f64| {
                    (ws == WorkingSet::Stream)
                        .then(|| 100.0 * g * case.traffic_per_byte() / ceiling.traffic_gbps)
                };
                let best_peer = isal_rate
                    .iter()
                    .chain(kp_rate.iter())
                    .map(|r| r.gbps)
                    .reduce(f64::max);
                rows.push(Row {
                    case: case.name(),
                    shard_bytes: shard,
                    working_set: ws,
                    working_set_bytes: set_bytes,
                    sbod,
                    isal: isal_rate,
                    klauspost: kp_rate,
                    sbod_vs_isal: isal_rate.map(|r| sbod.gbps / r.gbps),
                    sbod_vs_klauspost: kp_rate.map(|r| sbod.gbps / r.gbps),
                    sbod_pct_of_ceiling: pct(sbod.gbps),
                    best_peer_pct_of_ceiling: best_peer.and_then(pct),
                });
                if !json {
                    print_row(rows.last().unwrap(), rows.len() == 1);
                }
            }
        }
    }
    let report = Report {
        cpu: bench::cpu_model(),
        isa,
        clock: "GB/s = 10^9 data-shard bytes per second of the measuring thread's CPU time; \
                '% ceil' = bytes read+written per second / those of a large streaming copy",
        skew,
        ceiling,
        isal_decode_setup_us,
        rows,
    };
    if let Some(p) = &json_out {
        std::fs::write(
            p,
            serde_json::to_string_pretty(&report).expect("serialisable"),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serialisable")
        );
    } else {
        println!();
        println!(
            "cpu: {}; sbod kernels: {}; shard skew {} B",
            report.cpu, isa, skew
        );
        println!("{}", report.clock);
        println!(
            "memory ceiling: copy {:.1} GB/s (memcpy {:.1}, streaming copy {:.1}), {:.1} GB/s read+written",
            ceiling.copy_gbps, ceiling.memcpy_gbps, ceiling.stream_copy_gbps, ceiling.traffic_gbps
        );
        println!("ISA-L decode setup (gf_invert_matrix + ec_init_tables, 10+4, 2 lost): {:.2} us per pattern; sbod caches it", isal_decode_setup_us);
    }
}

fn print_row(r: &Row, header: bool) {
    if header {
        println!(
            "{:<24} {:>6} {:>6} | {:>6} {:>6} {:>6} | {:>6} {:>6} | {:>6} {:>6}",
            "case", "shard", "set", "sbod", "ISA-L", "klaus", "/ISA-L", "/klaus", "%ceil", "peer%"
        );
    }
    let f = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
    let shard = if r.shard_bytes >= 1 << 20 {
        format!("{}M", r.shard_bytes >> 20)
    } else {
        format!("{}K", r.shard_bytes >> 10)
    };
    println!(
        "{:<24} {:>6} {:>6} | {:>6.1} {:>6} {:>6} | {:>6} {:>6} | {:>6} {:>6}",
        r.case,
        shard,
        r.working_set.to_string(),
        r.sbod.gbps,
        f(r.isal.map(|x| x.gbps), 1),
        f(r.klauspost.map(|x| x.gbps), 1),
        f(r.sbod_vs_isal, 2),
        f(r.sbod_vs_klauspost, 2),
        f(r.sbod_pct_of_ceiling, 0),
        f(r.best_peer_pct_of_ceiling, 0),
    );
}
