//! The monitor's events from status changes, and their delivery to a real program and a
//! real HTTP listener.

use sbod_mgmt::monitor::{diff, initial, Delivery};
use sbod_types::{ArrayState, EventKind, MemberState, ProcessKind, ProcessStatus, Status};

fn status(state: &str, members: &[(&str, &str, Option<usize>)]) -> Status {
    let members: Vec<_> = members
        .iter()
        .map(|(path, st, slot)| {
            serde_json::json!({"slot": slot, "group": slot.map(|_| 0), "path": path,
                "uuid": format!("u-{path}"), "state": st, "domain": "", "size": 1 << 20,
                "read_errors": 0, "write_errors": 0, "checksum_errors": 0, "repaired": 0,
                "reads": 0, "writes": 0, "recovered": null})
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "name": "vol0", "uuid": "x", "level": "raid5", "state": state, "failed_reason": null,
        "size": 1 << 21, "chunk": 65536, "groups": 1, "width": 3, "redundancy": 1, "event": 1,
        "members": members, "process": null, "last_process": null, "bitmap_region": null,
        "dirty_regions": 0, "resync_offset": null, "assembly": {"unclean": false,
        "resynced_bytes": 0, "resynced_regions": 0, "rebuilding": [], "ignored": [],
        "missing": []}
    }))
    .unwrap()
}

fn process(kind: ProcessKind, mismatches: u64, elapsed: f64) -> ProcessStatus {
    ProcessStatus {
        kind,
        done: 100,
        total: 100,
        percent: 100.0,
        elapsed_secs: elapsed,
        rate: 1.0,
        eta_secs: None,
        mismatches,
        repaired: 0,
        tags_repaired: 0,
        finished: true,
        cancelled: false,
        error: None,
        regions: vec![],
    }
}

fn kinds(v: &[sbod_types::Event]) -> Vec<EventKind> {
    v.iter().map(|e| e.event).collect()
}

#[test]
fn a_life_cycle_becomes_events() {
    let ok = status(
        "optimal",
        &[
            ("a", "active", Some(0)),
            ("b", "active", Some(1)),
            ("c", "active", Some(2)),
            ("s", "spare", None),
        ],
    );
    assert!(initial(&ok).is_empty());
    assert!(diff(&ok, &ok).is_empty(), "no change, no event");
    let failed = status(
        "degraded",
        &[
            ("a", "active", Some(0)),
            ("b", "failed", Some(1)),
            ("c", "active", Some(2)),
            ("s", "spare", None),
        ],
    );
    let e = diff(&ok, &failed);
    assert_eq!(
        kinds(&e),
        [EventKind::MemberFailed, EventKind::ArrayDegraded]
    );
    assert_eq!(e[0].member.as_deref(), Some("b"));
    assert_eq!(e[1].state, Some(ArrayState::Degraded));
    assert_eq!(kinds(&initial(&failed)), [EventKind::ArrayDegraded]);
    // The spare takes the slot and rebuilds.
    let mut rebuilding = status(
        "rebuilding",
        &[
            ("a", "active", Some(0)),
            ("s", "rebuilding", Some(1)),
            ("c", "active", Some(2)),
        ],
    );
    rebuilding.process = Some(ProcessStatus {
        finished: false,
        ..process(ProcessKind::Rebuild, 0, 1.0)
    });
    assert_eq!(
        kinds(&diff(&failed, &rebuilding)),
        [EventKind::RebuildStarted]
    );
    let mut done = status(
        "optimal",
        &[
            ("a", "active", Some(0)),
            ("s", "active", Some(1)),
            ("c", "active", Some(2)),
        ],
    );
    done.last_process = Some(process(ProcessKind::Rebuild, 0, 3.0));
    assert_eq!(
        kinds(&diff(&rebuilding, &done)),
        [
            EventKind::SpareActivated,
            EventKind::ArrayOptimal,
            EventKind::RebuildFinished
        ]
    );
    // A whole rebuild between two looks still tells all of it.
    assert_eq!(
        kinds(&diff(&failed, &done)),
        [
            EventKind::SpareActivated,
            EventKind::ArrayOptimal,
            EventKind::RebuildStarted,
            EventKind::RebuildFinished
        ]
    );
    // A scrub that finds mismatches, then a clean one; then the array fails.
    let mut scrubbed = done.clone();
    scrubbed.last_process = Some(process(ProcessKind::Check, 5, 2.0));
    let e = diff(&done, &scrubbed);
    assert_eq!(kinds(&e), [EventKind::ScrubMismatches]);
    assert!(e[0].message.contains("--repair"), "{}", e[0].message);
    let mut clean = done.clone();
    clean.last_process = Some(process(ProcessKind::Check, 0, 2.5));
    assert_eq!(kinds(&diff(&scrubbed, &clean)), [EventKind::ScrubFinished]);
    let mut dead = status(
        "failed",
        &[
            ("a", "failed", Some(0)),
            ("s", "failed", Some(1)),
            ("c", "active", Some(2)),
        ],
    );
    dead.last_process = clean.last_process.clone();
    dead.failed_reason = Some("group 0 has lost 2 of 3 members".into());
    let e = diff(&clean, &dead);
    assert_eq!(
        kinds(&e),
        [
            EventKind::MemberFailed,
            EventKind::MemberFailed,
            EventKind::ArrayFailed
        ]
    );
    assert!(e[2].message.contains("lost 2 of 3"));
    assert_eq!(dead.members[0].state, MemberState::Failed);
}

/// A program gets the event name, array and member as arguments and the JSON on stdin; a
/// webhook gets the JSON as an HTTP POST.
/// Health that gets worse is an event (once per step: warn, then failing); the member is
/// not failed for it; a spare taking its copy is a proactive replacement.
#[test]
fn worse_health_becomes_events() {
    use sbod_types::{Health, HealthVerdict};
    let health = |v: HealthVerdict, why: &str| Health {
        verdict: v,
        reasons: if why.is_empty() {
            vec![]
        } else {
            vec![why.to_string()]
        },
        ..Health::default()
    };
    let with = |h: Vec<Health>, spare: bool| {
        let mut members = vec![
            ("a", "active", Some(0)),
            ("b", "active", Some(1)),
            ("c", "active", Some(2)),
        ];
        if spare {
            members.push(("s", "spare", None));
        }
        let mut s = status("optimal", &members);
        for (m, h) in s.members.iter_mut().zip(h) {
            m.health = Some(h);
        }
        s
    };
    let ok = || health(HealthVerdict::Ok, "");
    let na = || health(HealthVerdict::Unavailable, "a file");
    let base = with(vec![ok(), ok(), na()], false);
    assert!(initial(&base).is_empty(), "ok and unavailable are no news");
    assert!(diff(&base, &base).is_empty());
    let warn = with(
        vec![
            health(HealthVerdict::Warn, "3 pending sectors (warning at 1)"),
            ok(),
            na(),
        ],
        false,
    );
    let e = diff(&base, &warn);
    assert_eq!(kinds(&e), [EventKind::MemberHealth]);
    assert_eq!(e[0].member.as_deref(), Some("a"));
    assert!(
        e[0].message.contains("3 pending sectors"),
        "{}",
        e[0].message
    );
    assert!(diff(&warn, &warn).is_empty(), "said once");
    let failing = with(
        vec![
            health(HealthVerdict::Failing, "SMART assessment: FAILED"),
            ok(),
            na(),
        ],
        false,
    );
    let e = diff(&warn, &failing);
    assert_eq!(kinds(&e), [EventKind::MemberHealth]);
    assert!(
        e[0].message.contains("no hot spare: left in service"),
        "{}",
        e[0].message
    );
    assert_eq!(kinds(&initial(&failing)), [EventKind::MemberHealth]);
    assert!(diff(&failing, &warn).is_empty(), "better is no event");
    // With a spare: the spare turns into the member's replacement.
    let spare = with(vec![health(HealthVerdict::Failing, "x"), ok(), na()], true);
    let mut copying = spare.clone();
    copying.members[3].state = MemberState::Replacing;
    copying.members[3].slot = Some(0);
    assert_eq!(
        kinds(&diff(&spare, &copying)),
        [EventKind::ProactiveReplace]
    );
}

#[tokio::test]
async fn delivery_reaches_a_program_and_a_webhook() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let prog = dir.path().join("hook.sh");
    std::fs::write(
        &prog,
        format!(
            "#!/bin/sh\necho \"$1 $2 $3\" > {0}.args\ncat > {0}.json\n",
            out.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        // Read until the JSON body is complete (the event ends with "}").
        loop {
            let n = s.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
            if n == 0 || buf.ends_with(b"}") {
                break;
            }
        }
        s.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        String::from_utf8(buf).unwrap()
    });
    let d = Delivery {
        program: Some(prog),
        syslog: false,
        webhook: Some(format!("http://{addr}/hook")),
    };
    let ok = status(
        "optimal",
        &[("a", "active", Some(0)), ("b", "active", Some(1))],
    );
    let bad = status(
        "degraded",
        &[("a", "active", Some(0)), ("b", "failed", Some(1))],
    );
    let e = diff(&ok, &bad).remove(0);
    d.deliver(&e).await;
    let args = std::fs::read_to_string(format!("{}.args", out.display())).unwrap();
    assert_eq!(args.trim(), "member_failed vol0 b");
    let json: sbod_types::Event =
        serde_json::from_str(&std::fs::read_to_string(format!("{}.json", out.display())).unwrap())
            .unwrap();
    assert_eq!(json, e);
    let req = server.await.unwrap();
    assert!(req.starts_with("POST /hook HTTP/1.1"), "{req}");
    assert!(req.contains("application/json"), "{req}");
    let body = &req[req.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(serde_json::from_str::<sbod_types::Event>(body).unwrap(), e);
}
