use sbod_drive::model::{HddModel, Kind, Model, Op};
use sbod_drive::profile;
#[test]
fn scratch() {
    for (wce, bs) in [(true, 65536u64), (false, 65536), (true, 1 << 20)] {
        let mut p = profile::hdd_nearline();
        p.write_cache = wce;
        let size = 256u64 << 20;
        let mut m = HddModel::new(p, size, true, Vec::new());
        let mut pos = 0u64;
        let mut id = 0;
        let mut done = Vec::new();
        let n = (size / bs) as usize;
        for _ in 0..16 { id += 1; m.submit(0, id, Op { kind: Kind::Write { fua: false }, offset: pos, len: bs }); pos += bs; }
        let mut c = 0; let mut t = 0;
        while c < n {
            t = m.next_event().unwrap();
            done.clear();
            m.advance(t, &mut done);
            for _ in &done { c += 1; if pos < size { id += 1; m.submit(t, id, Op { kind: Kind::Write { fua: false }, offset: pos, len: bs }); pos += bs; } }
        }
        eprintln!("wce {wce} bs {bs}: {:.0} MB/s", size as f64 / (t as f64 / 1e9) / 1e6);
    }
}
