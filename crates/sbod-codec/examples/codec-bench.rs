//! sbod's own codec figures: `cargo run --release -p sbod-codec --example codec-bench --
//! [--json] [--long] [--isa NAME] [--stream-mib N] [--skew BYTES] [--filter TEXT]`.
//! (`sbod bench codec` runs the same thing; scripts/bench-codec.sh adds the peers.)

use sbod_codec::bench::{self, Options};

fn main() {
    let mut opts = Options::default();
    let mut json = false;
    let mut filter: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--json" => json = true,
            "--long" => opts.timing = Options::long().timing,
            "--isa" => opts.isa = Some(val().parse().unwrap_or_else(|e| panic!("{e}"))),
            "--stream-mib" => opts.stream_bytes = val().parse::<usize>().expect("MiB") << 20,
            "--skew" => opts.skew = val().parse().expect("bytes"),
            "--filter" => filter = Some(val()),
            _ => panic!("unknown argument {a}"),
        }
    }
    if let Some(f) = filter {
        opts.cases
            .retain(|c| format!("{} {}", c.scheme, c.op).contains(&f));
    }
    let report = bench::run(&opts);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serialisable")
        );
    } else {
        bench::print_table(&report);
    }
}
