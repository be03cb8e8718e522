//! `sbod-torture`: kill `sbod serve` under real NBD clients many times in a row and check
//! that nothing acknowledged is lost. Prints a summary table (Markdown) and, with
//! `--json`, the figures as JSON.

use clap::Parser;
use sbod_torture::{run, sbod_binary, seed_from_env, Options};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "sbod-torture",
    about = "SIGKILL sbod serve under NBD clients, verify every acknowledged write"
)]
struct Args {
    /// The sbod binary (default: $SBOD_BIN, or the one next to this program, or built).
    #[arg(long)]
    sbod: Option<PathBuf>,
    /// raid5, raid6, raid1, raid10, ec:K+M.
    #[arg(long, default_value = "raid6")]
    level: String,
    #[arg(long, default_value_t = 5)]
    members: usize,
    /// MiB per member file.
    #[arg(long, default_value_t = 64)]
    member_mib: u64,
    #[arg(long, default_value = "64K")]
    chunk: String,
    #[arg(long, default_value = "1M")]
    bitmap_region: String,
    /// How many times to kill the server.
    #[arg(long, default_value_t = 20)]
    crashes: u64,
    /// NBD connections writing at once.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Commands in flight per connection.
    #[arg(long, default_value_t = 8)]
    queue_depth: usize,
    /// Clients write between these many milliseconds before each kill.
    #[arg(long, default_value_t = 200)]
    min_ms: u64,
    #[arg(long, default_value_t = 2000)]
    max_ms: u64,
    /// Share of the volume the clients write.
    #[arg(long, default_value_t = 0.25)]
    hot_fraction: f64,
    /// Replay a run (default: $SBOD_TORTURE_SEED or the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Where to put the member files (a temporary directory inside it).
    #[arg(long)]
    workdir: Option<PathBuf>,
    #[arg(long)]
    json: bool,
    #[arg(long, short)]
    verbose: bool,
    /// MiB of a log device file given at create (every write journaled through it); 0:
    /// no log.
    #[arg(long, default_value_t = 0)]
    log_mib: u64,
    /// Declustered, with this many members' worth of spare space spread over the members
    /// (`create --declustered --spares N`).
    #[arg(long)]
    declustered: Option<usize>,
}

fn main() {
    let a = Args::parse();
    let sbod = a.sbod.clone().or_else(|| {
        std::env::var_os("SBOD_BIN").map(PathBuf::from).or_else(|| {
            let me = std::env::current_exe().ok()?;
            let p = me.parent()?.join("sbod");
            p.exists().then_some(p)
        })
    });
    let sbod = match sbod.map(Ok).unwrap_or_else(sbod_binary) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sbod-torture: {e:#}");
            std::process::exit(2);
        }
    };
    let o = Options {
        sbod,
        level: a.level,
        members: a.members,
        member_size: a.member_mib << 20,
        chunk: a.chunk,
        bitmap_region: a.bitmap_region,
        crashes: a.crashes,
        clients: a.clients,
        queue_depth: a.queue_depth,
        run_ms: (a.min_ms, a.max_ms.max(a.min_ms)),
        hot_fraction: a.hot_fraction,
        seed: a.seed.unwrap_or_else(seed_from_env),
        workdir: a.workdir,
        verbose: a.verbose,
        log_mib: a.log_mib,
        declustered: a.declustered,
    };
    match run(&o) {
        Ok(s) => {
            if a.json {
                println!("{}", serde_json::to_string_pretty(&s).expect("summary"));
            } else {
                print!("{}", s.table());
            }
        }
        Err(e) => {
            eprintln!("sbod-torture: FAILED: {e:#}");
            std::process::exit(1);
        }
    }
}
