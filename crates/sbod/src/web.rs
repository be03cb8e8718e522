//! `sbod web`: the HTTP API, Prometheus metrics and the dashboard (crate sbod-web), with the
//! monitor's alerts. Foreground; SIGTERM or Ctrl-C stops it cleanly.

use crate::monitor::DeliveryArgs;
use anyhow::Result;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct WebArgs {
    /// Address to listen on (port 0 picks a free one; the address is printed).
    #[arg(long, default_value = "127.0.0.1:9810")]
    pub listen: SocketAddr,
    /// Allow listening beyond loopback (then TLS, or --insecure, is required).
    #[arg(long)]
    pub allow_remote: bool,
    /// PEM certificate chain: serve HTTPS (with --tls-key).
    #[arg(long, requires = "tls_key", value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// With --allow-remote: serve plain HTTP (token and actions in clear) on a trusted network.
    #[arg(long)]
    pub insecure: bool,
    /// Print the API token (made now if there is none) and exit.
    #[arg(long)]
    pub print_token: bool,
    /// Seconds a client has to send a request's headers (an idle kept-alive connection
    /// is closed after as long).
    #[arg(long, default_value_t = 30.0, value_name = "SECS", value_parser = crate::serve::secs_arg)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body.
    #[arg(long, default_value_t = 30.0, value_name = "SECS", value_parser = crate::serve::secs_arg)]
    pub body_timeout: f64,
    #[command(flatten)]
    pub delivery: DeliveryArgs,
}

pub async fn web(args: WebArgs) -> Result<()> {
    if args.print_token {
        println!("{}", sbod_web::token()?);
        return Ok(());
    }
    let opts = sbod_web::Options {
        listen: args.listen,
        allow_remote: args.allow_remote,
        tls: args.tls_cert.zip(args.tls_key),
        insecure: args.insecure,
        delivery: args.delivery.delivery()?,
        interval: Duration::from_secs_f64(args.delivery.interval),
        header_timeout: Duration::from_secs_f64(args.header_timeout.max(0.001)),
        body_timeout: Duration::from_secs_f64(args.body_timeout.max(0.001)),
    };
    let scheme = if opts.tls.is_some() { "https" } else { "http" };
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signal");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    sbod_web::serve(opts, shutdown, |a| {
        eprintln!(
            "sbod web: listening on {scheme}://{a}/ (token in {})",
            sbod_web::token_path().display()
        )
    })
    .await?;
    eprintln!("sbod web: stopped");
    Ok(())
}
