use clap::{Parser, Subcommand};

/// sbod: a switched bunch of disks in software.
#[derive(Parser)]
#[command(name = "sbod", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Capacity, reliability and expected performance of a disk layout, or several side by side.
    Plan(sbod_plan::cli::PlanArgs),
}

fn main() {
    let result = match Cli::parse().command {
        Command::Plan(args) => sbod_plan::cli::run(&args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
