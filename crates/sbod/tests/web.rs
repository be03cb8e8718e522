//! `sbod web` through real clients: curl for every route of the API (auth refused without
//! the token, bad input answered 4xx and harming nothing), Prometheus' own text-format
//! parser (python3-prometheus-client's OpenMetrics parser) for /metrics, headless chromium
//! for the dashboard, and the monitor's events. Plus TLS with rustls and the listening rules.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn need(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "{tool} is not installed: run scripts/deps.sh");
}

/// Debian's python3, where python3-prometheus-client installs.
const PY: &str = "/usr/bin/python3";

struct Env {
    dir: tempfile::TempDir,
    children: Vec<Child>,
}

impl Drop for Env {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Env {
    fn new() -> Env {
        for t in ["curl", "nbdcopy", "chromium", PY] {
            need(t);
        }
        Env {
            dir: tempfile::tempdir().unwrap(),
            children: Vec::new(),
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sbod"));
        c.args(args)
            .current_dir(self.dir.path())
            .env("SBOD_STATE_DIR", self.p("state"));
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.cmd(args).output().unwrap();
        check(&o, &format!("sbod {args:?}"));
        String::from_utf8_lossy(&o.stdout).to_string()
    }

    fn sock(&self) -> String {
        self.p("nbd.sock").display().to_string()
    }

    fn serve(&mut self) {
        let c = self
            .cmd(&["serve", "vol0", "--nbd", &format!("unix:{}", self.sock())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(c);
        wait_for(|| {
            self.cmd(&["status", "vol0", "--json"])
                .output()
                .is_ok_and(|o| {
                    serde_json::from_slice::<Value>(&o.stdout).is_ok_and(|v| v["running"] == true)
                })
        });
    }

    /// Start `sbod web` on a free port with `extra` arguments; returns its base URL.
    fn web(&mut self, extra: &[&str]) -> String {
        let mut args = vec!["web", "--listen", "127.0.0.1:0", "--interval", "0.2"];
        args.extend(extra);
        let mut c = self
            .cmd(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(c.stderr.take().unwrap()).lines();
        self.children.push(c);
        loop {
            let l = lines
                .next()
                .expect("sbod web exited before listening")
                .unwrap();
            if let Some(rest) = l.split("listening on ").nth(1) {
                let url = rest.split_whitespace().next().unwrap();
                // Keep draining its stderr so it never blocks on a full pipe.
                std::thread::spawn(move || {
                    for l in lines.map_while(Result::ok) {
                        eprintln!("sbod web: {l}");
                    }
                });
                return url.trim_end_matches('/').to_string();
            }
        }
    }
}

fn check(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Does `f` come true within a minute?
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn wait_for(f: impl FnMut() -> bool) {
    assert!(eventually(f), "timed out waiting");
}

/// curl: returns (HTTP status, body).
fn curl(args: &[&str]) -> (u16, String) {
    let o = Command::new("curl")
        .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "60"])
        .args(args)
        .output()
        .unwrap();
    check(&o, &format!("curl {args:?}"));
    let out = String::from_utf8(o.stdout).unwrap();
    let (body, code) = out.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_string())
}

fn get(url: &str) -> (u16, Value) {
    let (c, b) = curl(&[url]);
    (c, serde_json::from_str(&b).unwrap_or(Value::String(b)))
}

fn post(url: &str, token: Option<&str>, body: &str) -> (u16, Value) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}"));
    let mut a = vec![
        "-X",
        "POST",
        "-H",
        "content-type: application/json",
        "-d",
        body,
    ];
    if let Some(h) = &auth {
        a.extend(["-H", h.as_str()]);
    }
    a.push(url);
    let (c, b) = curl(&a);
    (c, serde_json::from_str(&b).unwrap_or(Value::String(b)))
}

/// The dashboard as headless chromium renders it, after its scripts ran.
fn dashboard(env: &Env, url: &str) -> String {
    // A fresh profile for every run.
    let profile = tempfile::tempdir_in(env.dir.path()).unwrap();
    let o = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            &format!("--user-data-dir={}", profile.path().display()),
            "--virtual-time-budget=3000",
            "--dump-dom",
            &format!("{url}/"),
        ])
        .output()
        .unwrap();
    check(&o, "chromium --dump-dom");
    let dom = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        dom.contains("</html>"),
        "chromium gave no page:\n{}",
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .filter(|l| !l.contains("dbus"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    dom
}

/// Parse /metrics with Prometheus' own parser and return {name{labels}: value} as JSON.
fn scrape(url: &str) -> Value {
    let (code, text) = curl(&[&format!("{url}/metrics")]);
    assert_eq!(code, 200);
    let py = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        out[f"{s.name}{{{labels}}}"] = s.value
print(json.dumps(out))
"#;
    let mut c = Command::new(PY)
        .args(["-c", py])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    check(&o, "the Prometheus parser on /metrics");
    serde_json::from_slice(&o.stdout).unwrap()
}

fn m(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no sample {key} in /metrics"))
}

/// The fields of `sbod status --json` that do not move on their own.
fn stable(v: &Value) -> Value {
    let members: Vec<Value> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| serde_json::json!([m["path"], m["state"], m["slot"], m["size"]]))
        .collect();
    serde_json::json!([
        v["name"],
        v["uuid"],
        v["level"],
        v["state"],
        v["size"],
        v["running"],
        v["event"],
        members
    ])
}

#[test]
fn api_metrics_dashboard_and_events_through_real_clients() {
    let mut env = Env::new();
    let disks: Vec<String> = (0..4)
        .map(|i| env.p(&format!("d{i}.img")).display().to_string())
        .collect();
    let mut args = vec!["create", "vol0", "--level", "raid5", "--size-each", "24M"];
    args.extend(disks.iter().map(String::as_str));
    env.ok(&args);
    env.serve();
    let hook = env.p("hook.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\necho \"$1 $2 $3\" >> {}\n",
            env.p("events.log").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let url = env.web(&["--program", hook.to_str().unwrap()]);
    let api = format!("{url}/api/v1/arrays");

    // The token: made on first start, owner-only.
    let token = env.ok(&["web", "--print-token"]).trim().to_string();
    assert_eq!(token.len(), 64);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(env.p("state/web.token"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // GETs: the same JSON as `sbod status --json`.
    let (c, all) = get(&api);
    assert_eq!(c, 200);
    let cli: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    assert_eq!(stable(&all[0]), stable(&cli[0]));
    let (c, one) = get(&format!("{api}/vol0"));
    assert_eq!(c, 200);
    assert_eq!(one["state"], "optimal");
    assert_eq!(one["running"], true);
    let cli: Value = serde_json::from_str(&env.ok(&["status", "vol0", "--json"])).unwrap();
    assert_eq!(stable(&one), stable(&cli));
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&one), keys(&cli), "same fields as sbod status --json");
    let (c, e) = get(&format!("{api}/nope"));
    assert_eq!((c, e["kind"].as_str()), (404, Some("not_found")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("vol0"), "{e}");
    let (c, e) = get(&format!("{api}/.hidden"));
    assert_eq!((c, e["kind"].as_str()), (400, Some("invalid")), "{e}");

    // Actions: refused without the token or with a wrong one; bad input is a 4xx with a
    // message; none of it changes anything.
    let fail = format!("{api}/vol0/fail");
    let d1 = disks[1].as_str();
    let body = format!(r#"{{"member":"{d1}"}}"#);
    let (c, e) = post(&fail, None, &body);
    assert_eq!((c, e["kind"].as_str()), (401, Some("unauthorized")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("--print-token"));
    let (c, _) = post(&fail, Some("0123"), &body);
    assert_eq!(c, 401);
    for (bad, want) in [
        ("{", "bad JSON"),
        (r#"{"member": 5}"#, "bad JSON"),
        (r#"{"member":"x","force":true,"typo":1}"#, "unknown field"),
        (r#"{"member":"/nonexistent/disk"}"#, "not a member"),
    ] {
        let (c, e) = post(&fail, Some(&token), bad);
        assert_eq!(c, 400, "{bad}: {e}");
        assert!(e["error"].as_str().unwrap().contains(want), "{bad}: {e}");
    }
    let (c, e) = post(&format!("{api}/vol0/explode"), Some(&token), "{}");
    assert_eq!((c, e["kind"].as_str()), (404, Some("no_route")), "{e}");
    let (c, e) = post(&format!("{api}/nope/fail"), Some(&token), &body);
    assert_eq!(c, 404, "{e}");
    let (c, e) = post(
        &format!("{api}/vol0/set"),
        Some(&token),
        r#"{"rebuild_min_rate":"lots"}"#,
    );
    assert_eq!(c, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("not a size"), "{e}");
    let (c, e) = get(&format!("{url}/api/v2/whatever"));
    assert_eq!((c, e["kind"].as_str()), (404, Some("no_route")));
    let (c, _) = curl(&["-X", "DELETE", &format!("{api}/vol0")]);
    assert_eq!(c, 405);
    let (_, now) = get(&format!("{api}/vol0"));
    assert_eq!(
        stable(&now),
        stable(&one),
        "refused requests changed nothing"
    );

    // Client I/O, then /metrics through Prometheus' parser.
    let src = env.p("src.img");
    std::fs::write(&src, vec![7u8; 8 << 20]).unwrap();
    let uri = format!("nbd+unix:///?socket={}", env.sock());
    check(
        &Command::new("nbdcopy")
            .arg(&src)
            .arg(&uri)
            .output()
            .unwrap(),
        "nbdcopy",
    );
    let mx = scrape(&url);
    assert_eq!(m(&mx, "sbod_array_state{array=vol0,state=optimal}"), 1.0);
    assert_eq!(m(&mx, "sbod_array_state{array=vol0,state=degraded}"), 0.0);
    assert_eq!(
        m(
            &mx,
            &format!("sbod_member_state{{array=vol0,member={d1},state=active}}")
        ),
        1.0
    );
    assert_eq!(
        m(
            &mx,
            &format!("sbod_member_errors_total{{array=vol0,kind=checksum,member={d1}}}")
        ),
        0.0
    );
    assert!(m(&mx, "sbod_array_written_bytes_total{array=vol0}") >= (8 << 20) as f64);
    let writes = m(&mx, "sbod_array_writes_total{array=vol0}");
    assert!(writes >= 1.0);
    assert_eq!(
        m(
            &mx,
            "sbod_array_request_duration_seconds_count{array=vol0,op=write}"
        ),
        writes
    );
    assert_eq!(
        m(
            &mx,
            "sbod_array_request_duration_seconds_bucket{array=vol0,le=+Inf,op=write}"
        ),
        writes
    );
    let (c, io) = get(&format!("{api}/vol0/metrics"));
    assert_eq!(c, 200);
    assert!(io["write_bytes"].as_u64().unwrap() >= 8 << 20);

    // The dashboard shows the members, then the array degraded after `sbod fail`.
    let dom = dashboard(&env, &url);
    assert!(
        dom.contains(r#"data-array="vol0" data-state="optimal""#),
        "{dom}"
    );
    for d in &disks {
        assert!(
            dom.contains(&format!(
                r#"data-member="{d}" data-state="active" data-health="unavailable""#
            )),
            "{d}: a file's health is not available: {dom}"
        );
    }
    assert!(
        !dom.contains("cdn") && !dom.contains("https://"),
        "no outside assets"
    );
    env.ok(&["fail", "vol0", d1]);
    let dom = dashboard(&env, &url);
    assert!(
        dom.contains(r#"data-array="vol0" data-state="degraded""#),
        "{dom}"
    );
    assert!(
        dom.contains(&format!(r#"data-member="{d1}" data-state="failed""#)),
        "{dom}"
    );
    let mx = scrape(&url);
    assert_eq!(m(&mx, "sbod_array_state{array=vol0,state=degraded}"), 1.0);
    assert_eq!(
        m(
            &mx,
            &format!("sbod_member_state{{array=vol0,member={d1},state=failed}}")
        ),
        1.0
    );

    // A spare added through the API (its file made at the size asked) rebuilds the array.
    let spare = env.p("spare.img").display().to_string();
    let (c, e) = post(
        &format!("{api}/vol0/add"),
        Some(&token),
        &format!(r#"{{"members":["{spare}"],"size":"24M"}}"#),
    );
    assert_eq!(c, 200, "{e}");
    wait_for(|| get(&format!("{api}/vol0")).1["state"] == "optimal");
    // Scrub, set, replace, remove, through the API.
    let (c, e) = post(&format!("{api}/vol0/scrub"), Some(&token), "{}");
    assert_eq!(
        (c, e["result"]["kind"].as_str()),
        (200, Some("check")),
        "{e}"
    );
    wait_for(|| get(&format!("{api}/vol0")).1["last_process"]["kind"] == "check");
    // The monitor samples status (every 2 s) and status keeps only the last process: let
    // it see the check before the replacement's rebuild takes that place.
    wait_for(|| {
        get(&format!("{url}/api/v1/events"))
            .1
            .as_array()
            .is_some_and(|ev| ev.iter().any(|e| e["event"] == "scrub_finished"))
    });
    let (c, e) = post(
        &format!("{api}/vol0/set"),
        Some(&token),
        r#"{"rebuild_min_rate":"10M"}"#,
    );
    assert_eq!(
        (c, e["result"]["rebuild_min_rate"].as_u64()),
        (200, Some(10 << 20)),
        "{e}"
    );
    let new = env.p("new.img").display().to_string();
    let (c, e) = post(
        &format!("{api}/vol0/replace"),
        Some(&token),
        &format!(r#"{{"old":"{}","new":"{new}","size":25165824}}"#, disks[2]),
    );
    assert_eq!(c, 200, "{e}");
    wait_for(|| {
        let s = get(&format!("{api}/vol0")).1;
        s["state"] == "optimal"
            && s["members"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["path"] == new.as_str() && m["state"] == "active")
    });
    let extra = env.p("extra.img").display().to_string();
    let (c, _) = post(
        &format!("{api}/vol0/add"),
        Some(&token),
        &format!(r#"{{"members":["{extra}"],"size":"24M"}}"#),
    );
    assert_eq!(c, 200);
    let (c, e) = post(
        &format!("{api}/vol0/remove"),
        Some(&token),
        &format!(r#"{{"member":"{extra}"}}"#),
    );
    assert_eq!(c, 200, "{e}");
    assert!(!e["result"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["path"] == extra.as_str()));

    // The monitor saw it all and ran the program for each event.
    let mut kinds_seen = Vec::new();
    let all = eventually(|| {
        let (_, ev) = get(&format!("{url}/api/v1/events"));
        let kinds: Vec<&str> = ev
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["event"].as_str())
            .collect();
        kinds_seen = kinds.iter().map(|k| k.to_string()).collect();
        [
            "member_failed",
            "array_degraded",
            "spare_activated",
            "rebuild_started",
            "rebuild_finished",
            "array_optimal",
            "scrub_finished",
        ]
        .iter()
        .all(|k| kinds.contains(k))
    });
    assert!(all, "events seen: {kinds_seen:?}");
    let log = std::fs::read_to_string(env.p("events.log")).unwrap();
    assert!(log.contains(&format!("member_failed vol0 {d1}")), "{log}");
    assert!(log.contains("array_degraded vol0"), "{log}");

    // Every route the OpenAPI description names answers (POSTs refuse without a token,
    // which shows the route exists); GET / is HTML.
    let (_, doc) = get(&format!("{url}/api/v1/openapi.json"));
    for (path, ops) in doc["paths"].as_object().unwrap() {
        let u = format!("{url}{}", path.replace("{name}", "vol0"));
        for op in ops.as_object().unwrap().keys() {
            let (c, b) = if op == "post" {
                post(&u, None, "{}")
            } else {
                get(&u)
            };
            let want = if op == "post" { 401 } else { 200 };
            assert_eq!(c, want, "{op} {path}: {b}");
        }
    }

    // Stop through the API: the server exits cleanly.
    let (c, e) = post(&format!("{api}/vol0/stop"), Some(&token), "");
    assert_eq!(
        (c, e["result"]["stopped"].as_bool()),
        (200, Some(true)),
        "{e}"
    );
    let st = env.children[0].wait().unwrap();
    assert!(st.success(), "sbod serve exited with {st}");
    let (c, e) = post(&format!("{api}/vol0/scrub"), Some(&token), "{}");
    assert_eq!((c, e["kind"].as_str()), (409, Some("conflict")), "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("sbod serve vol0"),
        "{e}"
    );
    let (_, s) = get(&format!("{api}/vol0"));
    assert_eq!(s["running"], false);

    // SIGTERM stops the web service cleanly.
    let mut web = env.children.remove(1);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(web.id() as i32, libc::SIGTERM) };
    assert!(web.wait().unwrap().success());
}

#[test]
fn tls_and_listening_rules() {
    let mut env = Env::new();
    need("openssl");
    env.ok(&[
        "create",
        "vol0",
        "--level",
        "raid1",
        "--size-each",
        "8M",
        "a.img",
        "b.img",
    ]);
    // Beyond loopback only when asked, and then over TLS or explicitly in clear.
    let o = env.cmd(&["web", "--listen", "0.0.0.0:0"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--allow-remote"));
    let o = env
        .cmd(&["web", "--listen", "0.0.0.0:0", "--allow-remote"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--tls-cert") && err.contains("--insecure"),
        "{err}"
    );
    // HTTPS with rustls: curl checks the certificate.
    let (cert, key) = (env.p("cert.pem"), env.p("key.pem"));
    check(
        &Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "2", "-subj", "/CN=localhost"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap(),
        "openssl req",
    );
    let url = env.web(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    assert!(url.starts_with("https://"), "{url}");
    let (c, b) = curl(&[
        "--cacert",
        cert.to_str().unwrap(),
        &format!("{url}/api/v1/arrays/vol0"),
    ]);
    assert_eq!(c, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["running"].as_bool()),
        (Some("optimal"), Some(false))
    );
    // Plain HTTP to the TLS port is not served.
    let o = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            &url.replace("https://", "http://"),
        ])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&o.stdout).contains("optimal"));
}

/// A request whose headers never complete is closed at the header deadline; one whose body
/// never completes is answered 408 and closed at the body deadline; a whole request on the
/// same server is served meanwhile. Control: each stalled connection was held (not closed
/// at once) before its deadline.
#[test]
fn slow_requests_are_closed() {
    use std::io::{Read, Write};
    let mut env = Env::new();
    let url = env.web(&["--header-timeout", "2", "--body-timeout", "2"]);
    let addr = url.trim_start_matches("http://").to_string();
    let open = |s: &mut std::net::TcpStream| {
        s.set_nonblocking(true).unwrap();
        let r = s.read(&mut [0u8; 1]);
        s.set_nonblocking(false).unwrap();
        matches!(r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    };
    // Read until the server closes; what it sent.
    let until_closed = |s: &mut std::net::TcpStream| -> String {
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut got = Vec::new();
        let mut b = [0u8; 4096];
        loop {
            match s.read(&mut b) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("the server did not close the slow request: {e}"),
            }
        }
        String::from_utf8_lossy(&got).to_string()
    };

    let mut headers = std::net::TcpStream::connect(&addr).unwrap();
    headers
        .write_all(b"GET /api/v1/arrays HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut body = std::net::TcpStream::connect(&addr).unwrap();
    body.write_all(
        b"POST /api/v1/arrays/vol0/scrub HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ki",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(open(&mut headers), "the half-sent headers were not held");
    assert!(open(&mut body), "the half-sent body was not held");
    let (c, _) = get(&format!("{url}/api/v1/arrays"));
    assert_eq!(
        c, 200,
        "a whole request was not served beside the slow ones"
    );

    let got = until_closed(&mut headers);
    assert!(!got.contains("200 OK"), "{got}");
    let got = until_closed(&mut body);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("\"kind\":\"timeout\""), "{got}");
}

/// Member paths holding `"`, `\` and newlines (one spelling out a whole forged series) reach
/// /metrics as label values that Prometheus' parser reads back as exactly those paths,
/// and no forged series appears. Control: the same path written raw into a label (as
/// prometheus-client would) does forge the series, so the names are hostile.
#[test]
fn hostile_member_paths_cannot_forge_metrics() {
    let mut env = Env::new();
    let forged = "sbod_array_state{array=\"FORGED\",state=\"failed\"} 1";
    let names = [
        format!("d0\"}} 1\n{forged}\n# x.img"),
        "d1\\\"\\n.img".to_string(),
        "d2 \"quoted\" \\.img".to_string(),
    ];
    let disks: Vec<String> = names
        .iter()
        .map(|n| env.p(n).display().to_string())
        .collect();
    let mut args = vec!["create", "vol0", "--level", "raid1", "--size-each", "16M"];
    args.extend(disks.iter().map(String::as_str));
    env.ok(&args);
    let url = env.web(&[]);
    let (code, text) = curl(&[&format!("{url}/metrics")]);
    assert_eq!(code, 200);
    let parse = |text: &str, openmetrics: bool| -> Vec<(String, serde_json::Map<String, Value>)> {
        let module = if openmetrics {
            "prometheus_client.openmetrics.parser"
        } else {
            "prometheus_client.parser"
        };
        let py = format!(
            "import json, sys\nfrom {module} import text_string_to_metric_families\n\
             print(json.dumps([[s.name, s.labels] for f in \
             text_string_to_metric_families(sys.stdin.read()) for s in f.samples]))\n"
        );
        let mut c = Command::new(PY)
            .args(["-c", &py])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let o = c.wait_with_output().unwrap();
        check(&o, "the Prometheus parser on /metrics");
        serde_json::from_slice::<Vec<(String, serde_json::Map<String, Value>)>>(&o.stdout).unwrap()
    };
    let samples = parse(&text, true);
    let forged_series = |s: &[(String, serde_json::Map<String, Value>)]| {
        s.iter()
            .any(|(_, l)| l.get("array").and_then(Value::as_str) == Some("FORGED"))
    };
    assert!(
        !forged_series(&samples),
        "a forged series in /metrics:\n{text}"
    );
    for d in &disks {
        let n = samples
            .iter()
            .filter(|(name, l)| {
                name == "sbod_member_size_bytes"
                    && l.get("member").and_then(Value::as_str) == Some(d.as_str())
            })
            .count();
        assert_eq!(n, 1, "member {d:?} is not read back as itself:\n{text}");
    }
    // Control: written raw, the first path forges the series.
    let raw = format!(
        "# TYPE sbod_member_size_bytes gauge\nsbod_member_size_bytes{{array=\"vol0\",member=\"{}\"}} 1\n",
        disks[0]
    );
    assert!(
        forged_series(&parse(&raw, false)),
        "the hostile path does not forge a series when raw: the test proves nothing"
    );
}
