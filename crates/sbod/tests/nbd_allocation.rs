//! `sbod serve` answers NBD block status (`base:allocation`) from what the array knows: a
//! raid5 over member files sbod made starts all holes; what clients write is data, and
//! only that (nbdinfo --map, qemu-img map); every extent reported zero reads as zeros;
//! nbdcopy of the mostly empty volume reads only the data from the members (its
//! --no-extents peer reads it all); a trim gives whole stripes back as holes; and after a
//! restart the map is the same (it is derived from the members, nothing to lose).

mod common;
use common::*;
use std::process::Command;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// nbdinfo --map: (offset, length, type) per line.
fn map_of(uri: &str) -> Vec<(u64, u64, u32)> {
    run(Command::new("nbdinfo").arg("--map").arg(uri))
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

fn member_reads(sbod: &Sbod, name: &str) -> u64 {
    let s = sbod.status(name);
    s["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["reads"].as_u64().unwrap())
        .sum()
}

fn nbdsh(uri: &str, body: &str) {
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    run(Command::new("nbdsh")
        .env("PATH", path)
        .arg("-c")
        .arg(format!("h.connect_uri(\"{uri}\")\n{body}\nh.shutdown()\n")));
}

/// Is `at..at+len` wholly inside extents of type 0 (data)?
fn is_data(map: &[(u64, u64, u32)], at: u64, len: u64) -> bool {
    map.iter()
        .filter(|e| e.0 < at + len && e.0 + e.1 > at)
        .all(|e| e.2 == 0)
}

#[test]
fn block_status_of_an_array_through_real_clients() {
    for t in ["nbdinfo", "nbdcopy", "nbdsh", "qemu-img"] {
        need(t);
    }
    let dir = tempfile::tempdir().unwrap();
    let sbod = Sbod::new(dir.path());
    let mut procs = Procs::default();
    sbod.ok(&[
        "create",
        "v",
        "--level",
        "raid5",
        "--chunk",
        "64K",
        "--size-each",
        "40M",
        "d0.img",
        "d1.img",
        "d2.img",
        "d3.img",
    ]);
    let uri = sbod.serve(&mut procs, "v");
    let size: u64 = run(Command::new("nbdinfo").arg("--size").arg(&uri))
        .trim()
        .parse()
        .unwrap();
    // A new array: one hole.
    assert_eq!(map_of(&uri), vec![(0, size, 3)]);

    // Writes: 64 KiB at 1 MiB, 4 KiB at 50 MiB, 3 MiB of whole stripes at 60 MiB (the
    // stripe holds 192 KiB of data).
    let sd = 192 * KIB;
    let big = 60 * MIB / sd * sd;
    nbdsh(
        &uri,
        &format!(
            "h.pwrite(b\"a\" * 65536, {})\nh.pwrite(b\"b\" * 4096, {})\nh.pwrite(b\"c\" * {}, {big})",
            MIB,
            50 * MIB,
            16 * sd
        ),
    );
    let map = map_of(&uri);
    assert!(is_data(&map, MIB, 64 * KIB), "{map:?}");
    assert!(is_data(&map, 50 * MIB, 4 * KIB), "{map:?}");
    assert!(is_data(&map, big, 16 * sd), "{map:?}");
    let data: u64 = map.iter().filter(|e| e.2 == 0).map(|e| e.1).sum();
    let written = 64 * KIB + 4 * KIB + 16 * sd;
    // A row written on one member is data in the stripe's other chunks too (their rows are
    // read to rebuild it): at most k times what was written.
    assert!(
        data <= 3 * written,
        "{data} bytes of data reported for {written} written"
    );
    assert!(map.iter().any(|e| e.2 == 3 && e.1 >= 8 * MIB), "{map:?}");

    // qemu-img map agrees.
    let q = run(Command::new("qemu-img").args(["map", "--output=json", "-f", "raw", &uri]));
    assert!(q.contains("\"data\": false"), "{q}");
    assert!(q.contains("\"data\": true"), "{q}");

    // A sparse copy reads only the data from the members; every hole reads as zeros.
    let before = member_reads(&sbod, "v");
    let copy = dir.path().join("copy.img");
    run(Command::new("nbdcopy").arg(&uri).arg(&copy));
    let sparse = member_reads(&sbod, "v") - before;
    let bytes = std::fs::read(&copy).unwrap();
    assert_eq!(bytes.len() as u64, size);
    for &(at, len, t) in &map {
        if t & 2 != 0 {
            assert!(
                bytes[at as usize..(at + len) as usize]
                    .iter()
                    .all(|&b| b == 0),
                "{at}+{len} reported zero but is not"
            );
        }
    }
    assert!(bytes[MIB as usize..(MIB + 64 * KIB) as usize]
        .iter()
        .all(|&b| b == b'a'));
    let before = member_reads(&sbod, "v");
    run(Command::new("nbdcopy")
        .arg("--no-extents")
        .arg(&uri)
        .arg(dir.path().join("full.img")));
    let full = member_reads(&sbod, "v") - before;
    assert!(
        sparse * 10 < full,
        "the sparse copy made {sparse} member reads, the full one {full}"
    );

    // A trim of the big write's whole stripes: holes again.
    nbdsh(&uri, &format!("h.trim({}, {big})", 16 * sd));
    let map = map_of(&uri);
    assert!(
        map.iter()
            .any(|e| e.2 == 3 && e.0 <= big && e.0 + e.1 >= big + 16 * sd),
        "{map:?}"
    );

    // After a restart: the same map.
    sbod.ok(&["stop", "v"]);
    procs.kill("head");
    let uri = sbod.serve(&mut procs, "v");
    assert_eq!(map_of(&uri), map);
    sbod.ok(&["stop", "v"]);
}

/// `sbod export` of a file answers block status from the file's holes (what a head or
/// nbdcopy reading a remote member sees).
#[test]
fn sbod_export_of_a_file_reports_its_holes() {
    need("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(64 * MIB).unwrap();
        f.write_all_at(&[5u8; 8192], 8 * MIB).unwrap();
    }
    let sock = dir.path().join("x.sock");
    let mut procs = Procs::default();
    procs.spawn(
        "export",
        Command::new(env!("CARGO_BIN_EXE_sbod"))
            .args(["export", img.to_str().unwrap(), "--nbd"])
            .arg(format!("unix:{}", sock.display()))
            .env("SBOD_STATE_DIR", dir.path().join("state")),
    );
    let uri = format!("nbd+unix:///disk.img?socket={}", sock.display());
    wait_nbd(&uri, std::time::Duration::from_secs(30));
    assert_eq!(
        map_of(&uri),
        vec![
            (0, 8 * MIB, 3),
            (8 * MIB, 8 * KIB, 0),
            (8 * MIB + 8 * KIB, 56 * MIB - 8 * KIB, 3)
        ]
    );
}
