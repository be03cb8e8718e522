//! The `sbod` command.

mod cmd;
mod export;
mod lab;
mod monitor;
mod output;
mod serve;
mod web;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "sbod",
    version,
    about = "A switched bunch of disks: RAID and erasure coding in software, served over NBD",
    after_help = "Arrays are known by name; SBOD_STATE_DIR sets where sbod keeps its state."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create an array.
    Create(cmd::CreateArgs),
    /// Assemble an array from its members (their superblocks describe it).
    Assemble(cmd::AssembleArgs),
    /// Show arrays, members and background processes.
    Status(cmd::StatusArgs),
    /// Print the superblock of members.
    Examine(cmd::ExamineArgs),
    /// Take a member out of service (the array goes degraded; refused, without --force,
    /// where the array would stop serving).
    Fail(cmd::FailArgs),
    /// Remove a failed member or a spare from an array.
    Remove(cmd::MemberArgs),
    /// Add hot spares (a degraded array rebuilds onto one at once); a former member whose
    /// slot is out goes back into it, resynced from the write-intent bitmap.
    Add(cmd::AddArgs),
    /// Rebuild a new member in place of an old one.
    Replace(cmd::ReplaceArgs),
    /// Change an array's shape online: more members (raid0/5/6/ec and raid10 are
    /// restriped, mirrors get another copy, concat grows), or one mirror copy fewer.
    Grow(cmd::GrowArgs),
    /// Check parity and mirrors; --repair fixes what it finds.
    Scrub(cmd::ScrubArgs),
    /// Stop a served array cleanly.
    Stop(cmd::NameArgs),
    /// Forget a stopped array's registration (members are left as they are).
    Forget(cmd::NameArgs),
    /// Change a served array's settings.
    Set(cmd::SetArgs),
    /// Read every member's disk health now (SMART through smartctl), with its enclosure
    /// slot and stable identity.
    Health(cmd::HealthArgs),
    /// Light a member's locate LED (its enclosure slot; sysfs or ledctl); --off puts it out.
    Locate(cmd::LocateArgs),
    /// Serve an array over NBD (foreground; Ctrl-C or `sbod stop` ends it cleanly).
    Serve(serve::ServeArgs),
    /// Watch arrays and deliver their events to a program, syslog and a webhook.
    Monitor(monitor::MonitorArgs),
    /// HTTP API, Prometheus metrics and a dashboard for every registered array.
    Web(web::WebArgs),
    /// Serve this host's raw disks over NBD, as members for arrays on other hosts
    /// (nbd://HOST/NAME).
    Export(export::ExportArgs),
    /// Capacity, reliability and expected performance of a disk layout, or several side by side.
    Plan(sbod_plan::cli::PlanArgs),
    /// Measure an array with fio through its life cycle against a no-RAID baseline.
    Bench(lab::BenchCmd),
    /// The storage lab on file-backed members it creates (and removes): a short benchmark
    /// through the whole life cycle with a report.
    Demo(lab::DemoArgs),
}

fn main() {
    // Behave like a Unix tool when piped into `head`: die quietly on a closed pipe.
    // SAFETY: setting a signal disposition at startup, before any threads exist.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SBOD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if matches!(cli.cmd, Cmd::Serve(_) | Cmd::Web(_) | Cmd::Monitor(_)) {
        // Services outlive their peers: a client or an alert program that goes away must
        // give an EPIPE to handle, not end the process.
        // SAFETY: as above, before the runtime's threads exist.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // This host, as the members' owner blocks name it (one id per state directory), for
    // the commands that may open an array's members; the others (status, examine, plan,
    // the demo's own process, ...) leave the state directory as they found it.
    let opens_members = matches!(
        cli.cmd,
        Cmd::Create(_)
            | Cmd::Assemble(_)
            | Cmd::Fail(_)
            | Cmd::Remove(_)
            | Cmd::Add(_)
            | Cmd::Replace(_)
            | Cmd::Grow(_)
            | Cmd::Scrub(_)
            | Cmd::Stop(_)
            | Cmd::Set(_)
            | Cmd::Serve(_)
            | Cmd::Web(_)
            | Cmd::Bench(_)
    );
    match opens_members
        .then(sbod_mgmt::registry::owner_config)
        .transpose()
    {
        Ok(None) => {}
        Ok(Some(c)) => sbod_core::owner::set_default(c),
        // Without its state directory this process is a host of its own: it then waits
        // out the lease of its own earlier, crashed start too.
        Err(e) => tracing::warn!("no host id ({e:#}): this process uses one of its own"),
    }
    let r = rt.block_on(async {
        match cli.cmd {
            Cmd::Create(a) => cmd::create(a).await,
            Cmd::Assemble(a) => cmd::assemble(a).await,
            Cmd::Status(a) => cmd::status(a).await,
            Cmd::Examine(a) => cmd::examine(a).await,
            Cmd::Fail(a) => cmd::fail(a).await,
            Cmd::Remove(a) => cmd::remove(a).await,
            Cmd::Add(a) => cmd::add(a).await,
            Cmd::Replace(a) => cmd::replace(a).await,
            Cmd::Grow(a) => cmd::grow(a).await,
            Cmd::Scrub(a) => cmd::scrub(a).await,
            Cmd::Stop(a) => cmd::stop(a).await,
            Cmd::Forget(a) => cmd::forget(a).await,
            Cmd::Set(a) => cmd::set(a).await,
            Cmd::Health(a) => cmd::health(a).await,
            Cmd::Locate(a) => cmd::locate(a).await,
            Cmd::Serve(a) => serve::serve(a).await,
            Cmd::Monitor(a) => monitor::monitor(a).await,
            Cmd::Web(a) => web::web(a).await,
            Cmd::Export(a) => export::export(a).await,
            Cmd::Plan(a) => sbod_plan::cli::run(&a),
            Cmd::Bench(a) => match a.what {
                Some(lab::BenchWhat::Codec(c)) => lab::bench_codec(c),
                None => lab::bench(a.array).await,
            },
            Cmd::Demo(a) => lab::demo(a).await,
        }
    });
    if let Err(e) = r {
        eprintln!(
            "sbod: {}",
            sbod_mgmt::words::message(&e, sbod_mgmt::words::Style::Cli)
        );
        std::process::exit(1);
    }
}
