//! The control socket of a serving array: management requests reach the serving process
//! without stopping its I/O. One JSON [`Request`] per line, one JSON [`Response`] per line
//! (sbod-types' control messages). The client side is [`call`]; the server side hands each
//! request to [`Local`], the same code that manages an array opened in this process.

use crate::error::{advice_of, err_advised, kind_of, ErrorKind};
use crate::local::Local;
use crate::registry;
use anyhow::{anyhow, bail, Context, Result};
use sbod_types::control::{Request, Response};
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// Longest request line the server reads (requests are small; this bounds a bad client).
const MAX_LINE: usize = 64 << 10;

/// Send one request to a serving array. `Ok(None)` if no server is listening. A refusal
/// comes back as an error of the kind the server gave.
pub async fn call(name: &str, req: &Request) -> Result<Option<serde_json::Value>> {
    let path = registry::socket_path(name);
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
        return Err(err_advised(
            resp.kind.unwrap_or(ErrorKind::Invalid),
            resp.error.unwrap_or_else(|| "unknown error".into()),
            resp.advice,
        ));
    }
    Ok(Some(resp.result.unwrap_or(serde_json::Value::Null)))
}

/// Is a server running for `name`?
pub async fn running(name: &str) -> bool {
    UnixStream::connect(registry::socket_path(name))
        .await
        .is_ok()
}

/// Serve the control socket at `path` until `stop` fires.
pub async fn serve(
    local: Arc<Local>,
    path: &Path,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if UnixStream::connect(path).await.is_ok() {
        bail!(
            "another sbod process already serves '{}' ({})",
            local.name,
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
                let l = local.clone();
                tokio::spawn(async move {
                    let _ = handle(l, stream).await;
                });
            }
        }
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

async fn handle(local: Arc<Local>, stream: UnixStream) -> Result<()> {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut r)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        let resp = if line.len() > MAX_LINE {
            Response::err(ErrorKind::Invalid, "bad request: line too long")
        } else {
            match serde_json::from_slice::<Request>(&line) {
                Ok(req) => match local.call(req).await {
                    Ok(v) => Response::ok(v),
                    Err(e) => Response::advised(kind_of(&e), format!("{e:#}"), advice_of(&e)),
                },
                Err(e) => Response::err(ErrorKind::Invalid, format!("bad request: {e}")),
            }
        };
        let mut out = serde_json::to_vec(&resp)?;
        out.push(b'\n');
        w.write_all(&out).await?;
        if line.len() > MAX_LINE {
            return Ok(());
        }
    }
}
