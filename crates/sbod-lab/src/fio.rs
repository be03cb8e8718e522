//! Running the real fio (nbd engine) and reading its JSON.

use crate::proc::{kill_group, prepare_child, ChildSignal};
use crate::schema::Metrics;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The run was stopped on request (Ctrl-C). Travels inside `anyhow::Error`.
#[derive(Debug)]
pub struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped on request")
    }
}

impl std::error::Error for Cancelled {}

pub fn is_cancelled(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Cancelled>().is_some()
}

/// An NBD export fio drives: its URI and the bytes the job addresses (`size` of them from
/// `offset`). One job section, so one client connection, per target.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Target {
    pub uri: String,
    pub size: u64,
    pub offset: u64,
}

/// One fio invocation: one job section per target, reported as one group.
#[derive(Clone, Debug, PartialEq)]
pub struct FioJob {
    /// A label for messages ("nominal randread-4k rep 2").
    pub label: String,
    pub targets: Vec<Target>,
    /// Workload options (--rw, --bs, --iodepth ...).
    pub args: Vec<String>,
    /// Time-based run of this many seconds; None runs one pass over the size (preconditioning).
    pub runtime: Option<f64>,
    pub ramp: f64,
    pub percentiles: Vec<f64>,
}

impl FioJob {
    /// The planned wall time of the job, for progress (None: size-bound).
    pub fn planned_secs(&self) -> Option<f64> {
        self.runtime.map(|r| r + self.ramp)
    }

    /// The fio command line (after `fio`).
    pub fn command_line(&self) -> Vec<String> {
        let rbd = self.targets.iter().any(|t| t.uri.starts_with("rbd:"));
        let mut a: Vec<String> = vec![
            if rbd {
                "--ioengine=rbd".into()
            } else {
                "--ioengine=nbd".into()
            },
            "--output-format=json".into(),
            "--group_reporting".into(),
            "--unified_rw_reporting=both".into(),
            "--lat_percentiles=1".into(),
            format!(
                "--percentile_list={}",
                self.percentiles
                    .iter()
                    .map(|p| format!("{p}"))
                    .collect::<Vec<_>>()
                    .join(":")
            ),
            "--randrepeat=0".into(),
        ];
        a.extend(self.args.iter().cloned());
        if let Some(rt) = self.runtime {
            a.push("--time_based".into());
            a.push(format!(
                "--runtime={}ms",
                (rt * 1000.0).round().max(1.0) as u64
            ));
            if self.ramp > 0.0 {
                a.push(format!(
                    "--ramp_time={}ms",
                    (self.ramp * 1000.0).round() as u64
                ));
            }
            a.push("--norandommap".into());
        }
        for (i, t) in self.targets.iter().enumerate() {
            a.push(format!("--name=t{i}"));
            match crate::ceph::parse_rbd_uri(&t.uri) {
                // fio's rbd engine: the image by pool and name, the client by id; the
                // cluster's configuration file travels in CEPH_CONF (see `env`).
                Some((pool, image, _, id)) => {
                    a.push(format!("--clientname={id}"));
                    a.push(format!("--pool={pool}"));
                    a.push(format!("--rbdname={image}"));
                }
                None => a.push(format!("--uri={}", t.uri)),
            }
            a.push(format!("--size={}", t.size));
            if t.offset > 0 {
                a.push(format!("--offset={}", t.offset));
            }
        }
        a
    }

    /// Environment fio needs: CEPH_CONF for an RBD target (librados reads it).
    pub fn env(&self) -> Vec<(String, String)> {
        self.targets
            .iter()
            .filter_map(|t| crate::ceph::parse_rbd_uri(&t.uri))
            .filter(|x| !x.2.is_empty())
            .map(|x| ("CEPH_CONF".to_string(), x.2))
            .take(1)
            .collect()
    }
}

/// Runs fio jobs. The real one spawns fio; tests substitute a fake.
pub trait FioRunner {
    /// Run a job. `keep_going` is called every ~100 ms while it runs; when it returns false
    /// the job is stopped and the call returns a [`Cancelled`] error.
    fn run(&mut self, job: &FioJob, keep_going: &mut dyn FnMut() -> bool) -> Result<Metrics>;
    fn version(&self) -> String;
}

/// The real fio.
pub struct RealFio {
    pub program: String,
}

impl Default for RealFio {
    fn default() -> Self {
        RealFio {
            program: "fio".into(),
        }
    }
}

impl FioRunner for RealFio {
    fn run(&mut self, job: &FioJob, keep_going: &mut dyn FnMut() -> bool) -> Result<Metrics> {
        let out = tempfile::NamedTempFile::new()?;
        let err = tempfile::NamedTempFile::new()?;
        let mut cmd = Command::new(&self.program);
        cmd.args(job.command_line())
            .envs(job.env())
            .stdin(Stdio::null())
            .stdout(out.reopen()?)
            .stderr(err.reopen()?);
        prepare_child(&mut cmd, ChildSignal::Kill);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {} (install it: scripts/deps.sh)", self.program))?;
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break st;
            }
            if !keep_going() {
                kill_group(child.id(), libc::SIGKILL);
                let _ = child.wait();
                return Err(anyhow!(Cancelled));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let text = std::fs::read_to_string(out.path())?;
        let etext = std::fs::read_to_string(err.path()).unwrap_or_default();
        if !status.success() {
            bail!(
                "fio failed ({status}) for {}: {}",
                job.label,
                tail(&format!("{text}\n{etext}"), 1500)
            );
        }
        parse_output(&text, &job.percentiles).with_context(|| {
            format!(
                "reading fio's output for {}: {}",
                job.label,
                tail(&etext, 500)
            )
        })
    }

    fn version(&self) -> String {
        Command::new(&self.program)
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into())
    }
}

fn tail(s: &str, n: usize) -> String {
    let s = s.trim();
    if s.len() <= n {
        return s.to_string();
    }
    let mut i = s.len() - n;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    format!("...{}", &s[i..])
}

/// Parse fio's `--output-format=json` output. fio's nbd engine prints a banner line before the
/// JSON, so the document starts at the first line that opens with '{'.
pub fn parse_output(text: &str, percentiles: &[f64]) -> Result<Metrics> {
    let start = text
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| text.starts_with('{').then_some(0))
        .ok_or_else(|| anyhow!("no JSON document in fio's output"))?;
    let v: Value = serde_json::from_str(&text[start..]).context("fio JSON")?;
    let job = v["jobs"]
        .get(0)
        .ok_or_else(|| anyhow!("fio reported no jobs"))?;
    let e = job["error"].as_i64().unwrap_or(0);
    if e != 0 {
        bail!("fio job error {e}");
    }
    let f = |x: &Value| x.as_f64().unwrap_or(0.0);
    let read = &job["read"];
    let write = &job["write"];
    // unified_rw_reporting=both adds "mixed": reads and writes together, percentiles too.
    let all = if job["mixed"].is_object() {
        &job["mixed"]
    } else if f(&write["io_bytes"]) > 0.0 {
        write
    } else {
        read
    };
    let lat = if all["lat_ns"]["percentile"].is_object() {
        &all["lat_ns"]
    } else {
        &all["clat_ns"]
    };
    let mut pct = Vec::new();
    if let Some(map) = lat["percentile"].as_object() {
        for p in percentiles {
            let key = format!("{p:.6}");
            if let Some(ns) = map.get(&key).and_then(|x| x.as_f64()) {
                pct.push([*p, ns]);
            }
        }
    }
    let at = |p: f64| {
        pct.iter()
            .find(|x| (x[0] - p).abs() < 1e-9)
            .map(|x| x[1])
            .unwrap_or(0.0)
    };
    Ok(Metrics {
        iops: f(&all["iops"]),
        read_iops: f(&read["iops"]),
        write_iops: f(&write["iops"]),
        bw_bytes: f(&all["bw_bytes"]),
        lat_mean_ns: f(&all["lat_ns"]["mean"]),
        lat_p50_ns: at(50.0),
        lat_p99_ns: at(99.0),
        lat_p999_ns: at(99.9),
        server_cpu_pct: 0.0,
        iops_per_cpu_pct: 0.0,
        bytes_per_cpu_sec: 0.0,
        client_cpu_pct: f(&job["usr_cpu"]) + f(&job["sys_cpu"]),
        percentiles: pct,
    })
}

/// Wait helper: sleep in small steps while `keep_going` holds.
pub fn sleep_while(d: Duration, keep_going: &mut dyn FnMut() -> bool) -> Result<()> {
    let t = Instant::now();
    while t.elapsed() < d {
        if !keep_going() {
            return Err(anyhow!(Cancelled));
        }
        std::thread::sleep(Duration::from_millis(100).min(d.saturating_sub(t.elapsed())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../tests/data/fio-randrw.json");

    #[test]
    fn parses_real_fio_output_after_the_banner() {
        let p = [50.0, 99.0, 99.9];
        let m = parse_output(SAMPLE, &p).unwrap();
        assert!(m.iops > 0.0);
        assert!(m.read_iops > 0.0 && m.write_iops > 0.0);
        assert!((m.read_iops + m.write_iops - m.iops).abs() / m.iops < 0.01);
        assert!(m.bw_bytes > 0.0);
        assert!(m.lat_mean_ns > 0.0);
        assert!(
            m.lat_p50_ns > 0.0 && m.lat_p50_ns <= m.lat_p99_ns && m.lat_p99_ns <= m.lat_p999_ns
        );
        assert_eq!(m.percentiles.len(), 3);
        assert!(m.client_cpu_pct > 0.0);
    }

    #[test]
    fn refuses_output_without_json() {
        assert!(parse_output("fio: connected to NBD server\n", &[50.0]).is_err());
        let bad = SAMPLE.replace("\"error\" : 0", "\"error\" : 5");
        assert!(parse_output(&bad, &[50.0]).is_err());
    }

    #[test]
    fn command_line_has_one_section_per_target() {
        let j = FioJob {
            label: "x".into(),
            targets: vec![
                Target {
                    uri: "nbd+unix:///?socket=/a".into(),
                    size: 100,
                    ..Default::default()
                },
                Target {
                    uri: "nbd+unix:///?socket=/b".into(),
                    size: 200,
                    ..Default::default()
                },
            ],
            args: vec!["--rw=randread".into()],
            runtime: Some(1.5),
            ramp: 0.5,
            percentiles: vec![50.0, 99.9],
        };
        let c = j.command_line();
        assert!(c.contains(&"--runtime=1500ms".to_string()));
        assert!(c.contains(&"--ramp_time=500ms".to_string()));
        assert!(c.contains(&"--percentile_list=50:99.9".to_string()));
        let names: Vec<_> = c.iter().filter(|a| a.starts_with("--name=")).collect();
        assert_eq!(names.len(), 2);
        // Global options come before the first job section.
        let first = c.iter().position(|a| a.starts_with("--name=")).unwrap();
        assert!(c[..first].contains(&"--rw=randread".to_string()));
        assert_eq!(c.last().unwrap(), "--size=200");
    }
}
