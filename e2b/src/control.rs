//! The control plane: creating, finding, listing, extending, pausing, resuming and
//! killing sandboxes. Errors are `{"code": <HTTP status>, "message": …}`, as E2B's
//! API answers them.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use paddock_pool::Caller;
use serde_json::{json, Value};

use crate::registry::{Inner, Sbx, ENVD_VERSION};

mod creation;
mod lifecycle;
mod listing;
mod templates;

pub(crate) use creation::{create, default_engine};
pub(crate) use lifecycle::{connect, get, kill, pause, set_timeout};
pub(crate) use listing::list;
pub(crate) use templates::alias;

/// Most bytes of a control-plane request body.
const MAX_BODY: usize = 256 * 1024;

pub(crate) use crate::errors::ApiError;

type Answer = Result<HttpResponse, ApiError>;

/// The caller of a control-plane request, from its `X-API-Key`.
/// (`admission::require_key` checked it already on the control plane's routes.)
pub(crate) fn caller(inner: &Inner, req: &HttpRequest) -> Result<Caller, ApiError> {
    if let Some(caller) = crate::admission::checked_caller(req) {
        return Ok(caller);
    }
    inner
        .caller(req.headers())
        .ok_or_else(crate::admission::unauthorized)
}

/// Reads a control-plane body, at most `MAX_BODY` bytes (413 beyond; 408 for one
/// that stalls past `server.body_read_timeout_ms`). Called once the key is checked.
async fn read_body(mut payload: web::Payload) -> Result<Vec<u8>, ApiError> {
    use futures_util::StreamExt;
    let mut body = Vec::new();
    while let Some(piece) = payload.next().await {
        let piece = piece.map_err(|e| {
            if paddock_pool::http::is_body_timeout(&e) {
                ApiError::new(StatusCode::REQUEST_TIMEOUT, e.to_string())
            } else {
                ApiError::new(StatusCode::BAD_REQUEST, format!("reading the body: {e}"))
            }
        })?;
        if body.len() + piece.len() > MAX_BODY {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body has more than {MAX_BODY} bytes"),
            ));
        }
        body.extend_from_slice(&piece);
    }
    Ok(body)
}

/// Sandbox `id` when the caller of `req` may see it; another tenant's is answered as
/// one that does not exist.
pub(crate) fn mine(inner: &Inner, req: &HttpRequest, id: &str) -> Result<Arc<Sbx>, ApiError> {
    let caller = caller(inner, req)?;
    inner
        .visible(&caller, id)
        .ok_or_else(|| ApiError::not_found(id))
}

fn parse<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.len() > MAX_BODY {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body has {} bytes; at most {MAX_BODY}", body.len()),
        ));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed body: {e}")))
}

/// The `domain` a sandbox's names are under: `e2b.domain`, else (the URL mode) the
/// name this request reached the server by ([`crate::routing::url_mode_domain`]).
fn domain(inner: &Inner, req: &HttpRequest) -> Option<String> {
    inner
        .config
        .domain
        .clone()
        .or_else(|| crate::routing::url_mode_domain(req))
}

/// What create and connect answer: E2B's `Sandbox`.
fn created(inner: &Inner, s: &Sbx, req: &HttpRequest) -> Value {
    let mut v = json!({
        "templateID": s.template,
        "sandboxID": s.id,
        "clientID": "paddock",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": s.token,
        "domain": domain(inner, req),
    });
    if let Some(t) = &s.traffic_token {
        v["trafficAccessToken"] = json!(t);
    }
    v
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    let t: time::OffsetDateTime = t.into();
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn state(s: &Sbx) -> &'static str {
    if s.paused.load(Ordering::Acquire) {
        "paused"
    } else {
        "running"
    }
}

/// E2B's `ListedSandbox`; with the request, what `SandboxDetail` has besides.
fn described(inner: &Inner, s: &Sbx, detail: Option<&HttpRequest>) -> Value {
    let mut v = json!({
        "templateID": s.template,
        "sandboxID": s.id,
        "clientID": "paddock",
        "startedAt": rfc3339(s.started_at),
        "endAt": rfc3339(*s.end_at.lock()),
        "cpuCount": s.cpu_count,
        "memoryMB": s.memory_mb,
        "diskSizeMB": 0,
        "state": state(s),
        "envdVersion": ENVD_VERSION,
        "metadata": s.metadata,
    });
    if let Some(req) = detail {
        v["envdAccessToken"] = json!(s.token);
        v["domain"] = json!(domain(inner, req));
    }
    v
}

/// Any other path under the control plane's prefixes: a typed 404.
pub(crate) async fn unknown(req: HttpRequest) -> HttpResponse {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "{} {} is not a route of this server's E2B API",
            req.method(),
            req.path()
        ),
    )
    .response()
}
