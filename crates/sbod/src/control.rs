//! The control socket of a running array: management commands reach the serving process
//! without stopping its I/O. One JSON request per line, one JSON response per line.

use anyhow::{anyhow, bail, Context, Result};
use sbod_core::Array;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    Fail {
        member: String,
        #[serde(default)]
        force: bool,
    },
    Remove {
        member: String,
    },
    Add {
        member: String,
        domain: String,
        force: bool,
    },
    Replace {
        old: String,
        new: String,
        force: bool,
    },
    Scrub {
        repair: bool,
    },
    Set {
        rebuild_min_rate: Option<u64>,
        rebuild_max_rate: Option<u64>,
    },
    Stop,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

impl Response {
    fn ok(v: serde_json::Value) -> Response {
        Response {
            ok: true,
            error: None,
            result: Some(v),
        }
    }
    fn err(e: impl std::fmt::Display) -> Response {
        Response {
            ok: false,
            error: Some(e.to_string()),
            result: None,
        }
    }
}

/// Send one request to a running array. `Ok(None)` if no server is listening.
pub async fn call(name: &str, req: &Request) -> Result<Option<serde_json::Value>> {
    let path = crate::state::socket_path(name);
    let stream = match UnixStream::connect(&path).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(anyhow!("connecting to {}: {e}", path.display())),
    };
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    w.write_all(&line).await?;
    let mut lines = BufReader::new(r).lines();
    let resp = lines.next_line().await?.ok_or_else(|| {
        anyhow!("the server for '{name}' closed the connection without answering")
    })?;
    let resp: Response = serde_json::from_str(&resp).context("malformed answer from the server")?;
    if !resp.ok {
        bail!("{}", resp.error.unwrap_or_else(|| "unknown error".into()));
    }
    Ok(Some(resp.result.unwrap_or(serde_json::Value::Null)))
}

/// Is a server running for `name`?
pub async fn running(name: &str) -> bool {
    UnixStream::connect(crate::state::socket_path(name))
        .await
        .is_ok()
}

/// Serve the control socket until `stop` fires. A `Stop` request triggers `on_stop`.
pub async fn serve(
    array: Arc<Array>,
    path: &Path,
    on_stop: Arc<tokio::sync::Notify>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if UnixStream::connect(path).await.is_ok() {
        bail!(
            "another sbod process already serves '{}' ({})",
            array.name,
            path.display()
        );
    }
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            acc = listener.accept() => {
                let Ok((stream, _)) = acc else { continue };
                let a = array.clone();
                let s = on_stop.clone();
                tokio::spawn(async move {
                    let _ = handle(a, stream, s).await;
                });
            }
        }
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

async fn handle(
    array: Arc<Array>,
    stream: UnixStream,
    on_stop: Arc<tokio::sync::Notify>,
) -> Result<()> {
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Some(line) = lines.next_line().await? {
        let resp = match serde_json::from_str::<Request>(&line) {
            Ok(req) => execute(&array, req, &on_stop).await,
            Err(e) => Response::err(format!("bad request: {e}")),
        };
        let mut out = serde_json::to_vec(&resp)?;
        out.push(b'\n');
        w.write_all(&out).await?;
    }
    Ok(())
}

async fn execute(array: &Arc<Array>, req: Request, on_stop: &tokio::sync::Notify) -> Response {
    let r: Result<serde_json::Value> = async {
        match req {
            Request::Status => Ok(serde_json::to_value(array.status())?),
            Request::Fail { member, force } => {
                array.fail(&member, force).await?;
                crate::cmd::save_registry(array)?;
                Ok(serde_json::Value::Null)
            }
            Request::Remove { member } => {
                array.remove(&member).await?;
                crate::cmd::save_registry(array)?;
                Ok(serde_json::Value::Null)
            }
            Request::Add {
                member,
                domain,
                force,
            } => {
                // A failed member the array still holds open goes back on that handle
                // (opening it again would meet its own lock).
                let spec = match array.held_device(&member) {
                    Some(s) => s,
                    None => crate::members::open(&member, &domain)?,
                };
                let outcome = array.add(spec, force).await?;
                crate::cmd::save_registry(array)?;
                Ok(serde_json::to_value(outcome)?)
            }
            Request::Replace { old, new, force } => {
                let spec = crate::members::open(&new, "")?;
                array.replace(&old, spec, force).await?;
                crate::cmd::save_registry(array)?;
                Ok(serde_json::Value::Null)
            }
            Request::Scrub { repair } => {
                let h = array.start_scrub(repair)?;
                Ok(serde_json::to_value(h.status())?)
            }
            Request::Set {
                rebuild_min_rate,
                rebuild_max_rate,
            } => {
                let mut s = array.settings.lock();
                if let Some(v) = rebuild_min_rate {
                    s.rebuild_min_rate = v;
                }
                if let Some(v) = rebuild_max_rate {
                    s.rebuild_max_rate = v;
                }
                Ok(serde_json::to_value(&*s)?)
            }
            Request::Stop => {
                on_stop.notify_one();
                Ok(serde_json::Value::Null)
            }
        }
    }
    .await;
    match r {
        Ok(v) => Response::ok(v),
        Err(e) => Response::err(e),
    }
}
