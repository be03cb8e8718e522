//! `sbod monitor`: watch arrays and deliver their events (member failed, array degraded or
//! failed, rebuild started/finished, spare activated, scrub results) to a program, syslog
//! and a webhook, as `mdadm --monitor` does. Foreground; SIGTERM or Ctrl-C stops it.

use anyhow::{bail, Result};
use clap::Args;
use sbod_mgmt::monitor::{Delivery, Monitor};
use sbod_mgmt::{Logged, Manager, Offline};
use sbod_types::{Event, EventKind};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where events go (shared by `sbod monitor` and `sbod web`).
#[derive(Args, Debug, Clone)]
pub struct DeliveryArgs {
    /// Run PROGRAM for each event: `PROGRAM EVENT ARRAY [MEMBER]`, the event as JSON on stdin.
    #[arg(long, value_name = "PROGRAM")]
    pub program: Option<PathBuf>,
    /// Log events to syslog (facility daemon; the journal collects it).
    #[arg(long)]
    pub syslog: bool,
    /// POST each event as JSON to this http:// or https:// URL.
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// How often to look at the arrays, in seconds.
    #[arg(long, default_value_t = 2.0, value_name = "SECS")]
    pub interval: f64,
}

impl DeliveryArgs {
    pub fn delivery(&self) -> Result<Delivery> {
        if let Some(u) = &self.webhook {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                bail!("--webhook {u}: give an http:// or https:// URL");
            }
        }
        if !(0.1..=3600.0).contains(&self.interval) {
            bail!("--interval is between 0.1 and 3600 seconds");
        }
        Ok(Delivery {
            program: self.program.clone(),
            syslog: self.syslog,
            webhook: self.webhook.clone(),
        })
    }
}

#[derive(Args, Debug)]
pub struct MonitorArgs {
    /// Arrays to watch (default: every registered array, as they come and go).
    pub names: Vec<String>,
    #[command(flatten)]
    pub delivery: DeliveryArgs,
    /// Look once, deliver what the arrays' states call for, and exit.
    #[arg(long)]
    pub oneshot: bool,
    /// Deliver a test event for each array (to check the delivery), then exit.
    #[arg(long)]
    pub test: bool,
}

pub async fn monitor(args: MonitorArgs) -> Result<()> {
    let delivery = args.delivery.delivery()?;
    let mgr = Manager::new(Arc::new(Logged), Offline::Refuse);
    let mut mon = Monitor::new(delivery);
    if args.test {
        let names = if args.names.is_empty() {
            mgr.list()?
        } else {
            args.names.clone()
        };
        for n in names {
            let s = mgr.status(&n).await?;
            let e = Event {
                event: EventKind::Test,
                array: n.clone(),
                member: None,
                message: format!("{n}: test event from sbod monitor ({})", s.status.state),
                time: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
                state: Some(s.status.state),
            };
            mon.delivery.deliver(&e).await;
            println!("{}", serde_json::to_string(&e)?);
        }
        return Ok(());
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        for e in mon.poll(&mgr, &args.names).await {
            println!("{}", serde_json::to_string(&e)?);
        }
        if args.oneshot {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(args.delivery.interval)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
        }
    }
}
