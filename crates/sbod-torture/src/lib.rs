//! The out-of-process crash harness: `sbod serve` on real member files, real NBD clients
//! (libnbd, through its Python bindings) writing with FUA and FLUSH, and SIGKILL at random
//! moments (while clients write, while the server starts and resyncs, while it scrubs),
//! many times in a row. After each restart the whole volume is read back with nbdcopy and
//! judged: every write acknowledged with FUA, or acknowledged before a completed FLUSH,
//! must read back exactly; a block with other writes may hold its durable value or one of
//! those writes, never anything else. A scrub check must then find parity consistent, the
//! resync having covered only the regions being written.

use anyhow::{anyhow, bail, Context, Result};
use sbod_testkit::fault::Rng;
use serde::Serialize;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BLOCK: usize = 4096;
/// Blocks per unit a client owns (64 KiB).
const UNIT: u64 = 16;
const NAME: &str = "torture";
const WRITER_PY: &str = include_str!("writer.py");

#[derive(Clone, Debug)]
pub struct Options {
    /// The `sbod` binary under test.
    pub sbod: PathBuf,
    /// raid5, raid6, raid1, raid10, ec:K+M.
    pub level: String,
    pub members: usize,
    /// Bytes per member file.
    pub member_size: u64,
    pub chunk: String,
    pub bitmap_region: String,
    /// Server kills (the restarts that follow each are verified).
    pub crashes: u64,
    /// NBD connections writing at once, and commands in flight on each.
    pub clients: usize,
    pub queue_depth: usize,
    /// Clients write for a random time in this range before the kill (ms).
    pub run_ms: (u64, u64),
    /// Share of the volume the clients write (a hot spot), so the resync after a crash
    /// shows the write-intent bitmap at work.
    pub hot_fraction: f64,
    pub seed: u64,
    /// Where the member files go (a temporary directory inside it).
    pub workdir: Option<PathBuf>,
    pub verbose: bool,
    /// MiB of a log device file (`create --log`): every write journaled, replayed at each
    /// restart. 0: no log.
    pub log_mib: u64,
    /// Declustered (`create --declustered --spares N`): this many members' worth of
    /// spare space spread over the members with the group's stripes.
    pub declustered: Option<usize>,
}

impl Options {
    /// The bounded run of the test suite: a few crashes, well under a minute.
    pub fn bounded(sbod: PathBuf) -> Options {
        Options {
            sbod,
            level: "raid6".into(),
            members: 5,
            member_size: 12 << 20,
            chunk: "64K".into(),
            bitmap_region: "256K".into(),
            crashes: 4,
            clients: 3,
            queue_depth: 8,
            run_ms: (150, 600),
            hot_fraction: 0.25,
            seed: seed_from_env(),
            workdir: None,
            verbose: false,
            log_mib: 0,
            declustered: None,
        }
    }
}

/// `SBOD_TORTURE_SEED`, or the clock.
pub fn seed_from_env() -> u64 {
    std::env::var("SBOD_TORTURE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// The figures of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub layout: String,
    pub members: usize,
    pub member_size: u64,
    pub volume_size: u64,
    pub seed: u64,
    pub crashes: u64,
    pub kills_while_writing: u64,
    pub kills_while_starting: u64,
    pub kills_while_scrubbing: u64,
    pub writes_acked: u64,
    pub fua_acked: u64,
    pub flushes_acked: u64,
    pub bytes_acked: u64,
    pub writes_cut_off: u64,
    pub client_read_backs: u64,
    pub restarts_verified: u64,
    pub unclean_restarts: u64,
    /// Blocks whose content a FUA or a completed FLUSH fixed, read back exactly.
    pub durable_blocks_verified: u64,
    /// Blocks with writes not yet flushed: read back as the durable value or one of them.
    pub unflushed_blocks_verified: u64,
    /// Of those, blocks with an acknowledged (not yet durable) write, and how many still
    /// held it or a later write: a process crash keeps the kernel's page cache, so sbod
    /// loses none of them though FLUSH semantics would allow it.
    pub unflushed_acked_blocks: u64,
    pub unflushed_acked_kept: u64,
    pub bytes_verified: u64,
    pub resynced_bytes: u64,
    /// Member data bytes over all restarts (what a full resync would have covered).
    pub member_space_at_restarts: u64,
    pub scrubs: u64,
    pub scrub_mismatches: u64,
    /// With a log: records replayed into the pool at the restarts.
    pub log_records_replayed: u64,
    pub lost_blocks: u64,
    pub server_exits_on_its_own: u64,
    pub seconds: f64,
}

impl Summary {
    /// The summary as a Markdown table (docs/RELIABILITY.md).
    pub fn table(&self) -> String {
        let pct = |a: u64, b: u64| {
            if b == 0 {
                "0%".to_string()
            } else {
                format!("{:.1}%", 100.0 * a as f64 / b as f64)
            }
        };
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
        let rows: Vec<(&str, String)> = vec![
            (
                "layout",
                format!(
                    "{} over {} files of {}, volume {}",
                    self.layout,
                    self.members,
                    mib(self.member_size),
                    mib(self.volume_size)
                ),
            ),
            ("seed", self.seed.to_string()),
            (
                "SIGKILLs survived",
                format!(
                    "{} ({} while writing, {} while starting/resyncing, {} while scrubbing)",
                    self.crashes,
                    self.kills_while_writing,
                    self.kills_while_starting,
                    self.kills_while_scrubbing
                ),
            ),
            (
                "writes acknowledged",
                format!(
                    "{} ({} FUA), {}; {} flushes; {} writes cut off by a kill",
                    self.writes_acked,
                    self.fua_acked,
                    mib(self.bytes_acked),
                    self.flushes_acked,
                    self.writes_cut_off
                ),
            ),
            (
                "restarts verified",
                format!(
                    "{} ({} unclean), {} read back",
                    self.restarts_verified,
                    self.unclean_restarts,
                    mib(self.bytes_verified)
                ),
            ),
            (
                "durable blocks exact",
                self.durable_blocks_verified.to_string(),
            ),
            (
                "blocks with unflushed writes",
                format!(
                    "{} all old-or-new; of {} with an acknowledged write, {} kept it",
                    self.unflushed_blocks_verified,
                    self.unflushed_acked_blocks,
                    self.unflushed_acked_kept
                ),
            ),
            (
                "resync after crashes",
                format!(
                    "{} of {} member data ({})",
                    mib(self.resynced_bytes),
                    mib(self.member_space_at_restarts),
                    pct(self.resynced_bytes, self.member_space_at_restarts)
                ),
            ),
            (
                "scrub checks",
                format!("{}, {} mismatches", self.scrubs, self.scrub_mismatches),
            ),
            (
                "log records replayed at restarts",
                self.log_records_replayed.to_string(),
            ),
            (
                "client read-backs during writes",
                self.client_read_backs.to_string(),
            ),
            ("lost or wrong blocks", self.lost_blocks.to_string()),
            (
                "server exits not caused by the harness",
                self.server_exits_on_its_own.to_string(),
            ),
            ("wall time", format!("{:.0} s", self.seconds)),
        ];
        let mut s = String::from("| what | result |\n|---|---|\n");
        for (k, v) in rows {
            s.push_str(&format!("| {k} | {v} |\n"));
        }
        s
    }
}

/// The `sbod` binary to test: `$SBOD_BIN`, else built now by the cargo running us (a
/// no-op when `cargo test --workspace` has built it) into the target directory and
/// profile of the calling executable, so the binary is never stale.
pub fn sbod_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SBOD_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("executable directory")?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().context("profile directory")?;
    }
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(p) => p.to_string(),
        None => bail!("cannot tell the build profile from {}", exe.display()),
    };
    let target = dir.parent().context("target directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(cargo)
        .args([
            "build",
            "-p",
            "sbod",
            "--bin",
            "sbod",
            "--profile",
            &profile,
        ])
        .arg("--target-dir")
        .arg(target)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo to build sbod")?;
    if !out.status.success() {
        bail!("building sbod failed");
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact" && v["target"]["name"] == "sbod" {
            if let Some(p) = v["executable"].as_str() {
                return Ok(PathBuf::from(p));
            }
        }
    }
    bail!("cargo built sbod but named no executable")
}

/// A Python 3 with libnbd's bindings.
fn find_python() -> Result<PathBuf> {
    let mut cands: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("SBOD_PYTHON") {
        cands.push(p.into());
    }
    cands.extend(["/usr/bin/python3".into(), "python3".into()]);
    for c in cands {
        let ok = Command::new(&c)
            .args(["-c", "import nbd"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(c);
        }
    }
    bail!("no python3 with libnbd's bindings (install python3-libnbd: scripts/deps.sh)")
}

/// What a block may hold: the value known durable, and the writes since.
#[derive(Clone, Default)]
struct BlockModel {
    floor: u64,
    /// (tag, acknowledged at (CLOCK_MONOTONIC ns), FUA), oldest first.
    cands: Vec<(u64, Option<u64>, bool)>,
}

/// What one restart found.
#[derive(Default)]
struct Verified {
    durable: u64,
    unflushed: u64,
    acked: u64,
    acked_kept: u64,
    bad: Vec<String>,
}

fn decode(b: &[u8], blk: u64) -> Option<u64> {
    if b.iter().all(|&x| x == 0) {
        return Some(0);
    }
    let tag = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
    let at = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    (at == blk && b.chunks(16).all(|c| c == &b[..16])).then_some(tag)
}

struct Model {
    blocks: Vec<BlockModel>,
}

/// A logged write: first block, blocks, FUA, acknowledged at.
type Logged = (u64, u64, bool, Option<u64>);

impl Model {
    fn verify(&mut self, image: &[u8]) -> Verified {
        let mut v = Verified::default();
        for (i, b) in image.chunks(BLOCK).enumerate() {
            let m = &mut self.blocks[i];
            let got = decode(b, i as u64);
            let ok = got.is_some_and(|g| g == m.floor || m.cands.iter().any(|c| c.0 == g));
            if !ok {
                v.bad.push(format!(
                    "block {i}: holds {} but only {} (durable) or {:?} (not yet durable) may be there",
                    got.map(|t| format!("write {t:#x}"))
                        .unwrap_or_else(|| "bytes no write produced".into()),
                    m.floor,
                    m.cands.iter().map(|c| c.0).collect::<Vec<_>>()
                ));
                continue;
            }
            let got = got.expect("checked");
            if m.cands.is_empty() {
                v.durable += 1;
            } else {
                v.unflushed += 1;
                if let Some(i) = m.cands.iter().rposition(|c| c.1.is_some()) {
                    v.acked += 1;
                    if m.cands[i..].iter().any(|c| c.0 == got) {
                        v.acked_kept += 1;
                    }
                }
            }
            // What a restart finds on the members is durable from now on.
            m.floor = got;
            m.cands.clear();
        }
        v
    }

    /// Take in what the clients logged in one run.
    fn absorb(&mut self, logs: &[String], s: &mut Summary) -> Result<()> {
        // tag -> (first, n, fua, acked at)
        let mut writes: HashMap<u64, Logged> = HashMap::new();
        let mut flush_issued: HashMap<(usize, u64), u64> = HashMap::new();
        let mut covered = 0u64; // latest issue time of a completed flush
        for (c, log) in logs.iter().enumerate() {
            for line in log.lines() {
                let f: Vec<&str> = line.split(' ').collect();
                let num = |i: usize| -> Result<u64> {
                    f.get(i)
                        .and_then(|x| x.parse().ok())
                        .ok_or_else(|| anyhow!("client {c}: bad log line '{line}'"))
                };
                match f[0] {
                    "W" => {
                        writes.insert(num(1)?, (num(2)?, num(3)?, num(4)? == 1, None));
                    }
                    "A" => {
                        let w = writes
                            .get_mut(&num(1)?)
                            .ok_or_else(|| anyhow!("client {c}: ack of an unknown write"))?;
                        w.3 = Some(num(2)?);
                        s.writes_acked += 1;
                        s.fua_acked += w.2 as u64;
                        s.bytes_acked += w.1 * BLOCK as u64;
                    }
                    "E" => {}
                    "F" => {
                        flush_issued.insert((c, num(1)?), num(2)?);
                    }
                    "FA" => {
                        let t = flush_issued
                            .get(&(c, num(1)?))
                            .ok_or_else(|| anyhow!("client {c}: ack of an unknown flush"))?;
                        covered = covered.max(*t);
                        s.flushes_acked += 1;
                    }
                    "R" => s.client_read_backs += 1,
                    "BAD" => bail!("client {c} read back wrong data while writing: {line}"),
                    "X" => {}
                    _ => bail!("client {c}: unknown log line '{line}'"),
                }
            }
        }
        let mut order: Vec<(&u64, &Logged)> = writes.iter().collect();
        order.sort_by_key(|(t, _)| **t);
        for (tag, (first, n, fua, ack)) in order {
            if ack.is_none() {
                s.writes_cut_off += 1;
            }
            for b in *first..first + n {
                self.blocks[b as usize].cands.push((*tag, *ack, *fua));
            }
        }
        // A FUA write is durable when acknowledged; a completed FLUSH makes durable every
        // write acknowledged before it was issued (on any connection: multi-conn).
        for m in self.blocks.iter_mut() {
            let last = m
                .cands
                .iter()
                .rposition(|&(_, ack, fua)| ack.is_some_and(|t| fua || t < covered));
            if let Some(i) = last {
                m.floor = m.cands[i].0;
                m.cands.drain(..=i);
            }
        }
        Ok(())
    }
}

/// A running `sbod serve`, SIGKILLed if dropped.
struct Server {
    child: Child,
}

impl Server {
    fn kill(&mut self) -> Result<()> {
        // SAFETY: plain syscall on our own child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGKILL);
        }
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.kill();
        }
    }
}

struct Harness<'a> {
    o: &'a Options,
    dir: PathBuf,
    python: PathBuf,
    sock: PathBuf,
    log: PathBuf,
}

impl Harness<'_> {
    fn sbod(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.o.sbod);
        c.args(args)
            .current_dir(&self.dir)
            .env("SBOD_STATE_DIR", self.dir.join("state"));
        c
    }

    fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self
            .sbod(args)
            .output()
            .with_context(|| format!("running sbod {args:?}"))?;
        if !out.status.success() {
            bail!(
                "sbod {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    }

    fn status(&self) -> Result<serde_json::Value> {
        Ok(serde_json::from_str(
            &self.ok(&["status", NAME, "--json"])?,
        )?)
    }

    fn start(&self) -> Result<Server> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = self
            .sbod(&[
                "serve",
                NAME,
                "--nbd",
                &format!("unix:{}", self.sock.display()),
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting sbod serve")?;
        Ok(Server { child })
    }

    fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn wait_ready(&self, srv: &mut Server) -> Result<()> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(120) {
            if let Some(st) = srv.child.try_wait()? {
                bail!(
                    "sbod serve exited with {st} before serving:\n{}",
                    self.log_tail()
                );
            }
            if std::os::unix::net::UnixStream::connect(&self.sock).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("sbod serve did not come up:\n{}", self.log_tail())
    }

    /// The server must still be running when the harness kills it.
    fn kill(&self, srv: &mut Server, s: &mut Summary) -> Result<()> {
        if let Some(st) = srv.child.try_wait()? {
            s.server_exits_on_its_own += 1;
            bail!(
                "sbod serve exited on its own with {st}:\n{}",
                self.log_tail()
            );
        }
        srv.kill()?;
        s.crashes += 1;
        Ok(())
    }

    /// The whole volume, through a real client.
    fn dump(&self) -> Result<Vec<u8>> {
        let out = self.dir.join("dump.img");
        let _ = std::fs::remove_file(&out);
        File::create(&out)?;
        let st = Command::new("nbdcopy")
            .arg(format!("nbd+unix:///?socket={}", self.sock.display()))
            .arg(&out)
            .status()
            .context("running nbdcopy (install libnbd-bin: scripts/deps.sh)")?;
        if !st.success() {
            bail!("nbdcopy failed: {st}");
        }
        let mut v = Vec::new();
        File::open(&out)?.read_to_end(&mut v)?;
        std::fs::remove_file(&out)?;
        Ok(v)
    }

    /// Read back, judge, scrub: one verified restart.
    fn verify(&self, model: &mut Model, s: &mut Summary, scrub: bool, what: &str) -> Result<()> {
        let img = self.dump()?;
        if img.len() as u64 != s.volume_size {
            bail!(
                "{what}: read {} bytes, the volume has {}",
                img.len(),
                s.volume_size
            );
        }
        let v = model.verify(&img);
        s.restarts_verified += 1;
        s.durable_blocks_verified += v.durable;
        s.unflushed_blocks_verified += v.unflushed;
        s.unflushed_acked_blocks += v.acked;
        s.unflushed_acked_kept += v.acked_kept;
        s.bytes_verified += img.len() as u64;
        s.lost_blocks += v.bad.len() as u64;
        if !v.bad.is_empty() {
            bail!(
                "{what}: {} block(s) hold data they must not (seed {}):\n{}",
                v.bad.len(),
                self.o.seed,
                v.bad[..v.bad.len().min(20)].join("\n")
            );
        }
        if scrub {
            let r: serde_json::Value = serde_json::from_str(&self.ok(&["scrub", NAME, "--json"])?)?;
            let mism = r["mismatches"].as_u64().unwrap_or(u64::MAX);
            s.scrubs += 1;
            s.scrub_mismatches += mism;
            if mism != 0 {
                bail!("{what}: scrub found {mism} mismatches after the resync: {r}");
            }
        }
        Ok(())
    }

    /// Start the clients; returns their processes and log files.
    fn clients(
        &self,
        rng: &Rng,
        it: u64,
        window: (u64, u64),
        secs: f64,
    ) -> Result<Vec<(Child, PathBuf)>> {
        let mut v = Vec::new();
        for c in 0..self.o.clients {
            let log = self.dir.join(format!("client{c}.log"));
            let tag_base = ((it + 1) << 40) | ((c as u64 + 1) << 32);
            let child = Command::new(&self.python)
                .arg(self.dir.join("writer.py"))
                .args([
                    self.sock.display().to_string(),
                    c.to_string(),
                    self.o.clients.to_string(),
                    UNIT.to_string(),
                    rng.next().to_string(),
                    self.o.queue_depth.to_string(),
                    format!("{secs:.3}"),
                    tag_base.to_string(),
                    window.0.to_string(),
                    window.1.to_string(),
                ])
                .stdout(File::create(&log)?)
                .stderr(Stdio::inherit())
                .spawn()
                .context("starting an NBD client")?;
            v.push((child, log));
        }
        Ok(v)
    }
}

fn pick(rng: &Rng, range: (u64, u64)) -> u64 {
    range.0 + rng.below(range.1.saturating_sub(range.0) + 1)
}

/// Run the harness; the summary says what it did and found.
pub fn run(o: &Options) -> Result<Summary> {
    let t0 = Instant::now();
    let base = o.workdir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base)?;
    let tmp = tempfile::Builder::new()
        .prefix("sbod-torture")
        .tempdir_in(&base)?;
    let h = Harness {
        o,
        dir: tmp.path().to_path_buf(),
        python: find_python()?,
        sock: tmp.path().join("nbd.sock"),
        log: tmp.path().join("serve.log"),
    };
    std::fs::write(h.dir.join("writer.py"), WRITER_PY)?;
    let rng = Rng::new(o.seed);
    let members: Vec<String> = (0..o.members).map(|i| format!("m{i}.img")).collect();
    let mut args: Vec<String> = [
        "create",
        NAME,
        "--level",
        &o.level,
        "--chunk",
        &o.chunk,
        "--bitmap-region",
        &o.bitmap_region,
        "--size-each",
        &o.member_size.to_string(),
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if o.log_mib > 0 {
        let f = std::fs::File::create(h.dir.join("log.img"))?;
        f.set_len(o.log_mib << 20)?;
        args.extend(["--log".to_string(), "log.img".to_string()]);
    }
    if let Some(spares) = o.declustered {
        args.extend([
            "--declustered".to_string(),
            "--spares".to_string(),
            spares.to_string(),
        ]);
    }
    args.extend(members.iter().cloned());
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let created: serde_json::Value = serde_json::from_str(&h.ok(&argv)?)?;
    let volume = created["size"].as_u64().context("created size")?;
    let member_data = created["members"][0]["size"]
        .as_u64()
        .context("member size")?;
    let region = created["bitmap_region"].as_u64().unwrap_or(0);
    let mut s = Summary {
        layout: match (o.log_mib, o.declustered) {
            (0, None) => o.level.clone(),
            (0, Some(s)) => format!("{} declustered, {s} spare", o.level),
            (_, None) => format!("{} + log", o.level),
            (_, Some(s)) => format!("{} declustered, {s} spare + log", o.level),
        },
        members: o.members,
        member_size: o.member_size,
        volume_size: volume,
        seed: o.seed,
        ..Default::default()
    };
    let blocks = volume / BLOCK as u64;
    let mut model = Model {
        blocks: vec![BlockModel::default(); blocks as usize],
    };
    let units = blocks / UNIT;
    let wn = ((units as f64 * o.hot_fraction) as u64).clamp(o.clients as u64, units);
    let ws = rng.below(units - wn + 1);
    let window = (ws, ws + wn);
    let result = (|| -> Result<()> {
        let mut expect_unclean = false;
        for it in 0..o.crashes {
            let what = format!("crash {it} (seed {})", o.seed);
            let r = rng.below(100);
            let mut srv = h.start()?;
            if it > 0 && r < 15 {
                // While it assembles and resyncs.
                std::thread::sleep(Duration::from_millis(rng.below(250)));
                h.kill(&mut srv, &mut s)?;
                s.kills_while_starting += 1;
                if o.verbose {
                    eprintln!("{what}: killed while starting");
                }
                continue;
            }
            h.wait_ready(&mut srv)?;
            expect_unclean = expect_unclean || it > 0;
            let st = h.status()?;
            if st["state"] != "optimal" {
                bail!("{what}: the array is {} after a restart: {st}", st["state"]);
            }
            if o.log_mib > 0 {
                // The log is found again at every restart and journals every write.
                if st["log"]["journaling"] != true {
                    bail!("{what}: the log is not journaling after a restart: {st}");
                }
                s.log_records_replayed += st["log"]["replayed_records"].as_u64().unwrap_or(0);
            }
            let unclean = st["assembly"]["unclean"].as_bool().unwrap_or(false);
            if expect_unclean && !unclean {
                bail!("{what}: the restart did not notice the crash: {st}");
            }
            s.unclean_restarts += unclean as u64;
            let resynced = st["assembly"]["resynced_bytes"].as_u64().unwrap_or(0);
            s.resynced_bytes += resynced;
            s.member_space_at_restarts += member_data;
            // Past the hot spot's end, the regions the bitmap set ahead of a writer
            // moving forward (`SBOD_BITMAP_AHEAD`, the server's environment is ours).
            let ahead = sbod_core::bitmap::ahead_regions(region);
            let bound = (member_data as f64 * o.hot_fraction) as u64 + (2 + ahead) * region;
            if resynced > bound {
                bail!(
                    "{what}: resynced {resynced} bytes of {member_data}, though the clients only write {:.0}% of the volume",
                    o.hot_fraction * 100.0
                );
            }
            let scrub_kill = it > 0 && r < 30;
            h.verify(&mut model, &mut s, !scrub_kill, &what)?;
            if scrub_kill {
                let mut sc = h
                    .sbod(&["scrub", NAME])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()?;
                std::thread::sleep(Duration::from_millis(rng.below(300)));
                h.kill(&mut srv, &mut s)?;
                s.kills_while_scrubbing += 1;
                let _ = sc.wait();
                if o.verbose {
                    eprintln!("{what}: killed while scrubbing");
                }
                continue;
            }
            // Clients write; the server dies under them.
            let run = pick(&rng, o.run_ms);
            let cs = h.clients(&rng, it, window, run as f64 / 1000.0 + 30.0)?;
            std::thread::sleep(Duration::from_millis(run));
            h.kill(&mut srv, &mut s)?;
            s.kills_while_writing += 1;
            let mut logs = Vec::new();
            for (mut c, log) in cs {
                let t = Instant::now();
                while c.try_wait()?.is_none() {
                    if t.elapsed() > Duration::from_secs(60) {
                        let _ = c.kill();
                        bail!("{what}: an NBD client did not notice the server was gone");
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                logs.push(std::fs::read_to_string(&log)?);
            }
            let before = s.writes_acked;
            model.absorb(&logs, &mut s)?;
            if o.verbose {
                eprintln!(
                    "{what}: killed after {run} ms, {} writes acknowledged, resynced {resynced} at the restart before",
                    s.writes_acked - before
                );
            }
        }
        // The last restart; then a clean stop, and a start with nothing to resync.
        let mut srv = h.start()?;
        h.wait_ready(&mut srv)?;
        let st = h.status()?;
        s.resynced_bytes += st["assembly"]["resynced_bytes"].as_u64().unwrap_or(0);
        s.member_space_at_restarts += member_data;
        s.unclean_restarts += st["assembly"]["unclean"].as_bool().unwrap_or(false) as u64;
        h.verify(&mut model, &mut s, true, "final restart")?;
        h.ok(&["stop", NAME])?;
        let st = srv.child.wait()?;
        if !st.success() {
            bail!("sbod serve exited with {st} on stop:\n{}", h.log_tail());
        }
        let mut srv = h.start()?;
        h.wait_ready(&mut srv)?;
        let st = h.status()?;
        if st["assembly"]["unclean"] != false || st["assembly"]["resynced_bytes"] != 0 {
            bail!(
                "a clean stop left work for the next start: {}",
                st["assembly"]
            );
        }
        h.verify(&mut model, &mut s, false, "after a clean stop")?;
        h.ok(&["stop", NAME])?;
        srv.child.wait()?;
        Ok(())
    })();
    s.seconds = t0.elapsed().as_secs_f64();
    if let Err(e) = result {
        // Keep the evidence.
        let keep = tmp.keep();
        let _ = std::fs::File::create(keep.join("FAILED")).and_then(|mut f| writeln!(f, "{e:#}"));
        return Err(e.context(format!(
            "member files, server log and client logs kept in {}",
            keep.display()
        )));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(tag: u64, blk: u64) -> Vec<u8> {
        let mut v = Vec::new();
        for _ in 0..BLOCK / 16 {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&blk.to_le_bytes());
        }
        v
    }

    #[test]
    fn decode_recognises_blocks_and_refuses_mixtures() {
        assert_eq!(decode(&vec![0u8; BLOCK], 3), Some(0));
        assert_eq!(decode(&block(7, 3), 3), Some(7));
        assert_eq!(decode(&block(7, 3), 4), None, "misplaced");
        let mut torn = block(7, 3);
        torn[2048..].copy_from_slice(&block(8, 3)[2048..]);
        assert_eq!(decode(&torn, 3), None, "torn inside the block");
    }

    #[test]
    fn the_model_follows_fua_and_flush() {
        let mut m = Model {
            blocks: vec![BlockModel::default(); 4],
        };
        let mut s = Summary::default();
        // Client 0: write 1 (blocks 0-1) acked at 10, flush issued at 20 done; write 2
        // (block 2) FUA acked; write 3 (block 0) acked at 30, never flushed; write 4
        // (block 3) never acked.
        let log = "W 1 0 2 0\nA 1 10\nF 1 20\nFA 1\nW 2 2 1 1\nA 2 25\nW 3 0 1 0\nA 3 30\nW 4 3 1 0\nX gone\n";
        m.absorb(&[log.to_string()], &mut s).unwrap();
        assert_eq!(
            (
                s.writes_acked,
                s.fua_acked,
                s.flushes_acked,
                s.writes_cut_off
            ),
            (3, 1, 1, 1)
        );
        let img = |tags: [u64; 4]| -> Vec<u8> {
            tags.iter()
                .enumerate()
                .flat_map(|(i, t)| {
                    if *t == 0 {
                        vec![0u8; BLOCK]
                    } else {
                        block(*t, i as u64)
                    }
                })
                .collect()
        };
        assert!(m.blocks.iter().all(|b| b.floor != 0 || b.cands.len() == 1));
        let ok = m.clone_model().verify(&img([1, 1, 2, 0]));
        assert!(ok.bad.is_empty());
        assert!(m.clone_model().verify(&img([3, 1, 2, 4])).bad.is_empty());
        // Block 1 was flushed: zeros there are a loss. Block 2 was FUA.
        assert_eq!(m.clone_model().verify(&img([1, 0, 2, 0])).bad.len(), 1);
        assert_eq!(m.clone_model().verify(&img([1, 1, 0, 0])).bad.len(), 1);
        assert!(m.absorb(&["BAD 3 differs".into()], &mut s).is_err());
    }

    impl Model {
        fn clone_model(&self) -> Model {
            Model {
                blocks: self.blocks.clone(),
            }
        }
    }
}
