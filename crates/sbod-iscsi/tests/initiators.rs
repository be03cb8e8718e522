//! The target driven by initiators no one here wrote: libiscsi's tools (iscsi-inq,
//! iscsi-readcapacity16, iscsi-ls), qemu-img over its libiscsi driver, and libiscsi's
//! conformance suite (iscsi-test-cu); CHAP, the allow-list and digests through them.

mod common;
use common::*;
use std::process::Command;

#[test]
fn inquiry_capacity_and_discovery() {
    need("iscsi-inq", "libiscsi-bin");
    let t = start(Opts::default());
    let inq = ok(Command::new("iscsi-inq").arg(t.url()));
    assert!(
        inq.contains("Peripheral Device Type:DIRECT_ACCESS"),
        "{inq}"
    );
    assert!(inq.contains("Vendor:SBOD"), "{inq}");
    // Unit serial number and device identification pages.
    let serial = ok(Command::new("iscsi-inq")
        .args(["-e", "1", "-c", "128"])
        .arg(t.url()));
    assert!(serial.contains("test0001"), "{serial}");
    let ids = ok(Command::new("iscsi-inq")
        .args(["-e", "1", "-c", "131"])
        .arg(t.url()));
    assert!(ids.contains("NAA"), "{ids}");
    let cap = ok(Command::new("iscsi-readcapacity16").arg(t.url()));
    assert!(cap.contains("LOGICAL BLOCK LENGTH IN BYTES:512"), "{cap}");
    assert!(
        cap.contains(&format!("Total size:{}", 64u64 << 20)),
        "{cap}"
    );
    assert!(
        cap.contains("LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT:3"),
        "{cap}"
    );
    let ls = ok(Command::new("iscsi-ls")
        .arg("-s")
        .arg(format!("iscsi://{}", t.addr)));
    assert!(
        ls.contains(&format!("Target:{IQN} Portal:{},1", t.addr)),
        "{ls}"
    );
    assert!(
        ls.contains("Lun:0    Type:DIRECT_ACCESS (Size:63M)"),
        "{ls}"
    );
    // An unknown target is refused at login, and the server goes on.
    let o = run(
        Command::new("iscsi-inq").arg(format!("iscsi://{}/iqn.2025-01.io.sbod:nope/0", t.addr))
    );
    assert!(!o.status.success());
    ok(Command::new("iscsi-inq").arg(t.url()));
    assert!(
        t.stats
            .login_failures
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
}

#[test]
fn qemu_img_convert_and_compare_two_initiators_at_once() {
    need("qemu-img", "qemu-utils");
    need("iscsi-inq", "libiscsi-bin");
    let t = start(Opts::default());
    let dir = tempfile::tempdir().unwrap();
    // Two images, each written to its half by its own qemu-img at the same time.
    let half = 32usize << 20;
    let a = dir.path().join("a.img");
    let b = dir.path().join("b.img");
    std::fs::write(&a, pattern(half, 1)).unwrap();
    std::fs::write(&b, pattern(half, 2)).unwrap();
    let conv = |src: &std::path::Path, off: usize| {
        // qemu's raw driver with an offset over the iSCSI LUN: the half to write.
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "--target-image-opts"])
            .arg(src)
            .arg(format!(
                "driver=raw,offset={off},size={half},file.driver=iscsi,file.transport=tcp,file.portal={},file.target={IQN},file.lun=0",
                t.addr
            ))
            .spawn()
            .unwrap()
    };
    let (mut ca, mut cb) = (conv(&a, 0), conv(&b, half));
    assert!(ca.wait().unwrap().success());
    assert!(cb.wait().unwrap().success());
    let mut whole = std::fs::read(&a).unwrap();
    whole.extend(std::fs::read(&b).unwrap());
    assert!(
        t.backend.snapshot() == whole,
        "the volume holds other bytes than were written"
    );
    let w = dir.path().join("whole.img");
    std::fs::write(&w, &whole).unwrap();
    // qemu-img compare reads the whole LUN back through iSCSI.
    let cmp = ok(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&w)
        .arg(t.url()));
    assert!(cmp.contains("Images are identical"), "{cmp}");
    // A changed byte is seen.
    let mut other = whole.clone();
    other[12345] ^= 0xff;
    std::fs::write(&w, &other).unwrap();
    let o = run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&w)
        .arg(t.url()));
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // Header digests (CRC32C) negotiated by libiscsi: the same bytes come back.
    std::fs::write(&w, &whole).unwrap();
    let cmp = ok(Command::new("qemu-img")
        .args(["compare", "--image-opts"])
        .arg(format!("driver=raw,file.driver=file,file.filename={}", w.display()))
        .arg(format!(
            "driver=raw,file.driver=iscsi,file.transport=tcp,file.portal={},file.target={IQN},file.lun=0,file.header-digest=crc32c",
            t.addr
        )));
    assert!(cmp.contains("Images are identical"), "{cmp}");
}

#[test]
fn chap_one_way_mutual_and_the_allow_list() {
    need("iscsi-inq", "libiscsi-bin");
    let chap = sbod_iscsi::Chap {
        user: "alice".into(),
        secret: b"alice-secret-16b".to_vec(),
        mutual: Some(("target".into(), b"target-secret-16".to_vec())),
    };
    let t = start(Opts {
        chap: Some(chap),
        initiators: vec!["iqn.2025-01.test:allowed".into()],
        ..Default::default()
    });
    let inq = |url: String, name: &str| {
        run(Command::new("iscsi-inq").args(["-i", name]).arg(url))
            .status
            .success()
    };
    let good = "iqn.2025-01.test:allowed";
    assert!(
        inq(t.url_with("alice%alice-secret-16b", ""), good),
        "one-way CHAP"
    );
    assert!(
        inq(
            t.url_with(
                "alice%alice-secret-16b",
                "?target_user=target&target_password=target-secret-16"
            ),
            good
        ),
        "mutual CHAP"
    );
    assert!(!inq(t.url(), good), "no CHAP at all");
    assert!(
        !inq(t.url_with("alice%wrong-secret-xx", ""), good),
        "a wrong secret"
    );
    assert!(
        !inq(t.url_with("mallory%alice-secret-16b", ""), good),
        "a wrong user"
    );
    assert!(
        !inq(
            t.url_with("alice%alice-secret-16b", ""),
            "iqn.2025-01.test:other"
        ),
        "not on the allow-list"
    );
    // libiscsi checks the target's answer in mutual CHAP: a target without the right
    // secret would fail here; with it, it passes (above).
    assert!(inq(t.url_with("alice%alice-secret-16b", ""), good));
    assert!(
        t.stats
            .login_failures
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 4
    );
}

/// libiscsi's conformance suite over its iSCSI and SCSI families (docs/ISCSI.md lists what
/// it skips as not applicable, and why).
#[test]
fn libiscsi_test_suite() {
    need("iscsi-test-cu", "libiscsi-bin");
    let t = start(Opts::default());
    let t4k = start(Opts {
        block_size: 4096,
        ..Default::default()
    });
    for (t, family) in [(&t, "iSCSI"), (&t, "SCSI"), (&t4k, "SCSI")] {
        let lbppb = if t.addr == t4k.addr { 1 } else { 8 };
        let o = run(Command::new("iscsi-test-cu")
            .args(["--dataloss", "-n", &format!("--test={family}")])
            .arg(t.url())
            .current_dir(std::env::temp_dir()));
        let out =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        // "Suite X, Test Y had failures:" for each failed test.
        let failed: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("had failures"))
            .map(|l| l.trim())
            .collect();
        // The one known failure is the test's own: it asks for the status at LBA i+1 and
        // expects the descriptor at i+LBPPB (they differ when LBPPB > 1), where SBC-3
        // 5.7 fixes the first descriptor at the LBA asked.
        // With 4 KiB logical blocks (LBPPB 1) it passes.
        let allowed: &[&str] = if lbppb > 1 {
            &["Suite GetLBAStatus, Test UnmapSingle had failures:"]
        } else {
            &[]
        };
        let unexpected: Vec<&&str> = failed.iter().filter(|f| !allowed.contains(f)).collect();
        assert!(unexpected.is_empty(), "{family}: {unexpected:?}\n{out}");
        let summary = out
            .lines()
            .find(|l| l.trim_start().starts_with("tests "))
            .unwrap_or_else(|| panic!("no summary:\n{out}"));
        let n: Vec<u32> = summary
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        // tests Total Ran Passed Failed Inactive
        assert!(n.len() >= 4 && n[0] >= 15 && n[0] == n[1], "{summary}");
        eprintln!("{family} (LBPPB {lbppb}): {summary}");
    }
}
