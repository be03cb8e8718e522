//! `sbod web`: the HTTP API, Prometheus metrics and the dashboard for every array registered
//! in the state directory, on top of the management library (sbod-mgmt).
//!
//! - `GET /api/v1/arrays`, `GET /api/v1/arrays/NAME`: the JSON of `sbod status --json`;
//!   `GET /api/v1/arrays/NAME/metrics`: a served array's I/O counters and latency;
//!   `GET /api/v1/events`: the latest events; `GET /api/v1/openapi.json`: this API.
//! - `POST /api/v1/arrays/NAME/ACTION` (fail, remove, add, replace, scrub, set, stop) with a
//!   JSON body of the CLI's arguments; needs `Authorization: Bearer TOKEN` (the token file
//!   in the state directory, mode 0600, made on first start).
//! - `GET /metrics`: Prometheus. `GET /`: the dashboard (assets built into the binary).
//!
//! Bad input gets a 4xx with `{"ok": false, "error": ..., "kind": ...}` and changes nothing.

mod api;
pub mod prom;
mod token;

pub use token::{load_or_create as token, token_path};

use anyhow::{bail, Context, Result};
use sbod_mgmt::monitor::{Delivery, Monitor};
use sbod_mgmt::{Logged, Manager, Offline};
use sbod_types::Event;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Every route the service answers, as (method, path); the OpenAPI description lists the
/// same (a test checks).
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/"),
    ("get", "/metrics"),
    ("get", "/api/v1/openapi.json"),
    ("get", "/api/v1/arrays"),
    ("get", "/api/v1/arrays/{name}"),
    ("get", "/api/v1/arrays/{name}/metrics"),
    ("get", "/api/v1/events"),
    ("post", "/api/v1/arrays/{name}/fail"),
    ("post", "/api/v1/arrays/{name}/remove"),
    ("post", "/api/v1/arrays/{name}/add"),
    ("post", "/api/v1/arrays/{name}/replace"),
    ("post", "/api/v1/arrays/{name}/scrub"),
    ("post", "/api/v1/arrays/{name}/set"),
    ("post", "/api/v1/arrays/{name}/locate"),
    ("post", "/api/v1/arrays/{name}/stop"),
];

/// The OpenAPI description served at /api/v1/openapi.json.
pub const OPENAPI: &str = include_str!("openapi.json");

pub struct Options {
    pub listen: SocketAddr,
    pub allow_remote: bool,
    /// PEM certificate chain and private key: serve HTTPS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Serve plain HTTP beyond loopback (the operator says the network is trusted).
    pub insecure: bool,
    /// Where the web service's monitor delivers events.
    pub delivery: Delivery,
    pub interval: Duration,
    /// A request's headers must arrive within this (the next one's too, on a kept-alive
    /// connection): else the connection is closed.
    pub header_timeout: Duration,
    /// A request's body must arrive within this: else 408 and the connection is closed.
    pub body_timeout: Duration,
}

/// Check that the listening address and TLS choices go together.
pub fn check(o: &Options) -> Result<()> {
    let ip = o.listen.ip();
    if !ip.is_loopback() {
        if !o.allow_remote {
            bail!(
                "--listen {}: not a loopback address; add --allow-remote to serve other hosts \
                 (with --tls-cert/--tls-key, or --insecure on a trusted network)",
                o.listen
            );
        }
        if o.tls.is_none() && !o.insecure {
            bail!(
                "--listen {} with --allow-remote: give --tls-cert and --tls-key to serve HTTPS, \
                 or --insecure to send the token and actions in clear",
                o.listen
            );
        }
    }
    Ok(())
}

/// hyper closes a connection whose request headers do not arrive within `t` (it measures
/// from when it starts waiting for them, so an idle kept-alive connection is closed too);
/// the deadline needs a timer, which axum-server does not set. Only HTTP/1 is served.
fn header_deadline(
    b: &mut hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    t: Duration,
) {
    b.http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(t);
}

/// What the handlers share.
pub(crate) struct App {
    pub mgr: Manager,
    pub token: String,
    pub events: parking_lot::Mutex<VecDeque<Event>>,
}

const KEEP_EVENTS: usize = 200;

/// Serve until `shutdown` completes. `bound` hears the address actually bound (port 0).
pub async fn serve(
    o: Options,
    shutdown: impl std::future::Future<Output = ()>,
    bound: impl FnOnce(SocketAddr),
) -> Result<()> {
    check(&o)?;
    let token = token::load_or_create()?;
    let app = Arc::new(App {
        mgr: Manager::new(Arc::new(Logged), Offline::Refuse),
        token,
        events: parking_lot::Mutex::new(VecDeque::new()),
    });
    let router = api::router(app.clone()).layer(axum::middleware::from_fn_with_state(
        o.body_timeout,
        api::body_deadline,
    ));
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    let server = async move {
        let svc = router.into_make_service();
        match &o.tls {
            Some((cert, key)) => {
                let _ = rustls::crypto::ring::default_provider().install_default();
                let cfg = axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
                    .await
                    .with_context(|| {
                        format!(
                            "loading --tls-cert {} / --tls-key {}",
                            cert.display(),
                            key.display()
                        )
                    })?;
                // The TLS handshake has its own deadline (axum-server's, 10 s).
                let mut s = axum_server::bind_rustls(o.listen, cfg);
                header_deadline(s.http_builder(), o.header_timeout);
                s.handle(h).serve(svc).await
            }
            None => {
                let mut s = axum_server::bind(o.listen);
                header_deadline(s.http_builder(), o.header_timeout);
                s.handle(h).serve(svc).await
            }
        }
        .with_context(|| format!("serving on {}", o.listen))
    };
    let monitor = {
        let app = app.clone();
        let delivery = o.delivery.clone();
        let interval = o.interval;
        async move {
            let mut mon = Monitor::new(delivery);
            loop {
                let evs = mon.poll(&app.mgr, &[]).await;
                {
                    let mut q = app.events.lock();
                    for e in evs {
                        if q.len() == KEEP_EVENTS {
                            q.pop_front();
                        }
                        q.push_back(e);
                    }
                }
                tokio::time::sleep(interval).await;
            }
        }
    };
    let tell = {
        let handle = handle.clone();
        async move {
            if let Some(a) = handle.listening().await {
                bound(a);
            }
            std::future::pending::<()>().await
        }
    };
    tokio::select! {
        r = server => r?,
        _ = monitor => {}
        _ = tell => {}
        _ = shutdown => {
            handle.graceful_shutdown(Some(Duration::from_secs(5)));
        }
    }
    Ok(())
}
