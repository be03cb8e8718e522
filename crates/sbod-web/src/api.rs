//! The routes.

use crate::{prom, token, App, OPENAPI};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sbod_mgmt::{kind_of, ErrorKind};
use sbod_types::control::{AddArgs, GrowArgs, MemberArgs, ReplaceArgs, ScrubArgs, SetArgs};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::sync::Arc;

type St = State<Arc<App>>;

/// An error answer: a status and `{"ok": false, "error": ..., "kind": ...}`.
struct ApiError(StatusCode, String, &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.0,
            Json(json!({"ok": false, "error": self.1, "kind": self.2})),
        )
            .into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("header"));
        }
        r
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        let (code, kind) = match kind_of(&e) {
            ErrorKind::Invalid => (StatusCode::BAD_REQUEST, "invalid"),
            ErrorKind::Refused => (StatusCode::CONFLICT, "refused"),
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            ErrorKind::Conflict => (StatusCode::CONFLICT, "conflict"),
            ErrorKind::Io => (StatusCode::INTERNAL_SERVER_ERROR, "io"),
        };
        ApiError(
            code,
            sbod_mgmt::words::message(&e, sbod_mgmt::words::Style::Api),
            kind,
        )
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok(v: impl serde::Serialize) -> ApiResult {
    Ok(Json(json!({"ok": true, "result": v})).into_response())
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/assets/app.js", get(app_js))
        .route("/assets/app.css", get(app_css))
        .route("/metrics", get(metrics))
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/arrays", get(list))
        .route("/api/v1/arrays/{name}", get(one))
        .route("/api/v1/arrays/{name}/metrics", get(io_metrics))
        .route("/api/v1/events", get(events))
        .route("/api/v1/arrays/{name}/{action}", post(action))
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                "no such route: see /api/v1/openapi.json".into(),
                "no_route",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed here: see /api/v1/openapi.json".into(),
                "method",
            )
        })
        .with_state(app)
}

async fn index() -> Html<&'static str> {
    Html(include_str!("assets/index.html"))
}

async fn app_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/app.js"),
    )
}

async fn app_css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/app.css"),
    )
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

async fn list(State(app): St) -> ApiResult {
    let (ok, _bad) = app.mgr.status_all().await?;
    Ok(Json(ok).into_response())
}

async fn one(State(app): St, Path(name): Path<String>) -> ApiResult {
    Ok(Json(app.mgr.status(&name).await?).into_response())
}

async fn io_metrics(State(app): St, Path(name): Path<String>) -> ApiResult {
    match app.mgr.metrics(&name).await? {
        Some(m) => Ok(Json(m).into_response()),
        None => {
            sbod_mgmt::registry::load(&name)?;
            Err(ApiError(
                StatusCode::CONFLICT,
                format!("{name} is not served: I/O metrics come from the serving process"),
                "conflict",
            ))
        }
    }
}

async fn events(State(app): St) -> ApiResult {
    let v: Vec<_> = app.events.lock().iter().cloned().collect();
    Ok(Json(v).into_response())
}

async fn metrics(State(app): St) -> ApiResult {
    let names = app.mgr.list()?;
    let mut arrays = Vec::new();
    let mut unreadable = Vec::new();
    for n in names {
        match app.mgr.status(&n).await {
            Ok(s) => {
                let io = if s.running {
                    app.mgr.metrics(&n).await.ok().flatten()
                } else {
                    None
                };
                arrays.push((s, io));
            }
            Err(_) => unreadable.push(n),
        }
    }
    let text = prom::render(prom::Snapshot { arrays, unreadable });
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

fn authorised(app: &App, h: &HeaderMap) -> Result<(), ApiError> {
    let got = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match got {
        Some(t) if token::same(t.trim(), &app.token) => Ok(()),
        Some(_) => Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "wrong token: use the one in the state directory's web.token (`sbod web --print-token`)"
                .into(),
            "unauthorized",
        )),
        None => Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "actions need `Authorization: Bearer TOKEN` (the token: `sbod web --print-token`)"
                .into(),
            "unauthorized",
        )),
    }
}

/// Parse a JSON body into the action's arguments; an empty body is `{}`.
fn body<T: DeserializeOwned>(b: &Bytes) -> Result<T, ApiError> {
    let b: &[u8] = if b.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        b
    };
    serde_json::from_slice(b).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("bad JSON body: {e}"),
            "invalid",
        )
    })
}

async fn action(
    State(app): St,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
    raw: Bytes,
) -> ApiResult {
    authorised(&app, &headers)?;
    if !matches!(
        action.as_str(),
        "fail" | "remove" | "add" | "replace" | "grow" | "scrub" | "set" | "stop" | "locate"
    ) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no action '{action}': fail, remove, add, replace, grow, scrub, set, stop or locate"),
            "no_route",
        ));
    }
    let m = &app.mgr;
    // Every argument is checked before anything is done.
    sbod_mgmt::registry::load(&name)?;
    match action.as_str() {
        "fail" => {
            let a: MemberArgs = body(&raw)?;
            m.fail(&name, &a).await?;
            ok(m.status(&name).await?)
        }
        "remove" => {
            let a: MemberArgs = body(&raw)?;
            m.remove(&name, &a).await?;
            ok(m.status(&name).await?)
        }
        "add" => {
            let a: AddArgs = body(&raw)?;
            m.add(&name, &a).await?;
            ok(m.status(&name).await?)
        }
        "grow" => {
            let a: GrowArgs = body(&raw)?;
            let (_, reply) = m.grow(&name, &a, false).await?;
            ok(json!({"grow": reply, "status": m.status(&name).await?}))
        }
        "replace" => {
            let a: ReplaceArgs = body(&raw)?;
            m.replace(&name, &a, false).await?;
            ok(m.status(&name).await?)
        }
        "scrub" => {
            let a: ScrubArgs = body(&raw)?;
            ok(m.scrub(&name, &a, false).await?)
        }
        "set" => {
            let a: SetArgs = body(&raw)?;
            ok(m.set(&name, &a).await?)
        }
        "locate" => {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Locate {
                member: String,
                #[serde(default)]
                off: bool,
            }
            let a: Locate = body(&raw)?;
            let how = m.locate(&name, &a.member, !a.off).await?;
            ok(json!({"member": a.member, "locate": !a.off, "how": how}))
        }
        _ => {
            let _: Value = body::<serde_json::Map<String, Value>>(&raw).map(Value::Object)?;
            ok(json!({"stopped": m.stop(&name).await?}))
        }
    }
}

/// The largest request body read (the actions' JSON is a few hundred bytes).
const BODY_LIMIT: usize = 1 << 20;

/// Read a request's whole body within `t` before any handler sees it: a body that never
/// completes is answered 408 and its connection closed (hyper has no body deadline of its
/// own), one over [`BODY_LIMIT`] 413.
pub(crate) async fn body_deadline(
    axum::extract::State(t): axum::extract::State<std::time::Duration>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(t, axum::body::to_bytes(body, BODY_LIMIT)).await {
        Ok(Ok(bytes)) => {
            next.run(axum::extract::Request::from_parts(parts, bytes.into()))
                .await
        }
        Ok(Err(e)) => ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body unreadable or over {BODY_LIMIT} bytes: {e}"),
            "body",
        )
        .into_response(),
        Err(_) => {
            let mut r = ApiError(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {t:?}"),
                "timeout",
            )
            .into_response();
            r.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            r
        }
    }
}
