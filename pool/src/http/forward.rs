//! Calls on a sandbox that lives on another node of a fleet: the accepting node
//! forwards each one to the owner's HTTP API and streams its answer back, and relays
//! a WebSocket message by message, so a client may use any node for any sandbox and
//! never needs to reach the owner itself.
//!
//! The forwarded request carries the caller's own credentials: the owner
//! authenticates it again and applies its own walls, and the accepting node has
//! already answered `NOT_FOUND` for a sandbox the caller may not see. It also
//! carries [`FORWARDED_HEADER`] (the forwarding node's id), and a request with that
//! header is answered by the node it reaches, without routing it again.

use std::time::Duration;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::HeaderName;
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use actix_ws::{AggregatedMessage, CloseCode, CloseReason};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use paddock_core::{Error, ErrorCode};
use tokio_tungstenite::tungstenite;

use super::interactive::{is_upgrade, upgrade_error, MAX_WS_MESSAGE};
use super::tenancy::caller;
use super::{ApiError, State};
use crate::federation::SessionPlace;
use crate::Caller;

/// Set on a request one node forwards to another: the forwarding node's id. The
/// node it reaches answers it itself.
pub const FORWARDED_HEADER: &str = "x-paddock-forwarded";

/// How long reaching the owner may take before the call is answered
/// `FLEET_UNAVAILABLE`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Chunks of a forwarded request body in flight to the owner.
const BODY_CHUNKS: usize = 4;

thread_local! {
    /// One client per HTTP worker thread (each is its own runtime): its pooled
    /// connections to the other nodes are driven by the thread that made them.
    static CLIENT: Option<reqwest::Client> = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_keepalive(Duration::from_secs(10))
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .ok();
}

/// Whether a request was forwarded here by another node.
pub(super) fn forwarded(req: &HttpRequest) -> bool {
    req.headers().contains_key(FORWARDED_HEADER)
}

/// The sandbox id of a path under `/v1/sandboxes/{id}`.
fn sandbox_in(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/sandboxes/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// Middleware: a call on a sandbox another node owns goes to that node; one whose
/// owner is lost is answered here. Everything else (no fleet, no sandbox in the
/// path, a caller the handlers will refuse) goes on to the handlers here, and so
/// does a forwarded call unless this node itself ended the sandbox it names.
pub(super) async fn route_sessions(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(state) = req.app_data::<web::Data<State>>().cloned() else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body);
    };
    let forwarded = forwarded(req.request());
    let routed = match (state.paddock.federation(), sandbox_in(req.path())) {
        (Some(f), Some(id)) => match caller(&state.config, req.request()) {
            Ok(c) => Some((f.clone(), c, id.to_string())),
            // Refused by the handler, with its own answer.
            Err(_) => None,
        },
        _ => None,
    };
    let Some((federation, caller, id)) = routed else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body);
    };
    match federation.session_owner(&caller, &id, forwarded).await {
        Ok(SessionPlace::Here) => next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body),
        // A forwarded call is never sent on again.
        Ok(SessionPlace::Node { .. }) if forwarded => next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body),
        Ok(SessionPlace::Node { id: node, address }) => {
            let payload = req.extract::<web::Payload>().await?;
            let (http, _) = req.into_parts();
            let response = forward(
                &state,
                &caller,
                &http,
                Body::Stream(payload),
                &node,
                &address,
            )
            .await
            .unwrap_or_else(|e| e.error_response());
            Ok(ServiceResponse::new(http, response))
        }
        Err(e) => Ok(req.into_response(ApiError::from(e).error_response())),
    }
}

/// A request body to forward.
pub(super) enum Body {
    /// Still to be read from the client.
    Stream(web::Payload),
    /// Read already (a handler that looked at it first).
    Read(Bytes),
}

/// Headers that belong to one connection, not to the request or answer.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    )
}

/// The node that owns the sandbox did not answer.
fn unreachable(node: &str, address: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::from(
        Error::new(
            ErrorCode::FleetUnavailable,
            format!(
                "the sandbox is on node `{node}`, which did not answer at {address} ({e}); \
             retry shortly (once the fleet counts the node as lost, its sandboxes \
             answer NODE_LOST)"
            ),
        )
        .with_retry_after_ms(1_000),
    )
}

/// A forwarded call that got no answer.
pub(super) struct Unanswered {
    /// What the caller is answered.
    pub(super) error: ApiError,
    /// Whether the request may have reached the owner (it was sent, or the
    /// connection broke after it connected); `false` only when no connection was
    /// made.
    pub(super) sent: bool,
}

/// Forwards one request to the owner at `address` and streams its answer back.
pub(super) async fn forward(
    state: &State,
    caller: &Caller,
    req: &HttpRequest,
    body: Body,
    node: &str,
    address: &str,
) -> Result<HttpResponse, ApiError> {
    forward_to(state, caller, req, body, node, address)
        .await
        .map_err(|u| u.error)
}

/// [`forward`], telling a call that never reached the owner from one that may have.
pub(super) async fn forward_to(
    state: &State,
    caller: &Caller,
    req: &HttpRequest,
    body: Body,
    node: &str,
    address: &str,
) -> Result<HttpResponse, Unanswered> {
    let not_sent = |error: ApiError| Unanswered { error, sent: false };
    let sent = |error: ApiError| Unanswered { error, sent: true };
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    if is_upgrade(req) {
        let Body::Stream(payload) = body else {
            return Err(not_sent(upgrade_error(actix_web::error::ErrorBadRequest(
                "a WebSocket cannot be forwarded with a read body",
            ))));
        };
        return forward_socket(state, caller, req, payload, node, address, path)
            .await
            .map_err(sent);
    }
    let client = CLIENT
        .with(Clone::clone)
        .ok_or_else(|| not_sent(unreachable(node, address, "no HTTP client could be built")))?;
    let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes()).map_err(|e| {
        not_sent(ApiError::from(Error::invalid_options(
            "method",
            e.to_string(),
        )))
    })?;
    let mut out = client.request(method, format!("{address}{path}"));
    for (name, value) in req.headers() {
        if !hop_by_hop(name) {
            out = out.header(name.as_str(), value.as_bytes());
        }
    }
    out = out.header(FORWARDED_HEADER, this_node(state));
    let pump = match body {
        Body::Read(bytes) => {
            out = out.body(bytes);
            None
        }
        Body::Stream(mut payload) => {
            // The client's body is read on this thread and handed over through a
            // few chunks in flight (the reader here is not `Send`).
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(BODY_CHUNKS);
            let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|c| (c, rx))
            });
            out = out.body(reqwest::Body::wrap_stream(chunks));
            Some(actix_web::rt::spawn(async move {
                while let Some(chunk) = payload.next().await {
                    let chunk = chunk.map_err(|e| std::io::Error::other(e.to_string()));
                    let failed = chunk.is_err();
                    if tx.send(chunk).await.is_err() || failed {
                        break;
                    }
                }
            }))
        }
    };
    // A call on an owner that stops answering without closing its connections
    // ends once the fleet counts the owner lost, not when TCP gives up.
    let mut lost = owner_lost(state, node);
    let answer = tokio::select! {
        a = out.send() => a.map_err(|e| Unanswered {
            sent: !e.is_connect(),
            error: unreachable(node, address, e),
        }),
        why = &mut lost => Err(sent(ApiError::from(lost_error(node, &why)))),
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            if let Some(p) = pump {
                p.abort();
            }
            return Err(e);
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16())
        .map_err(|e| sent(unreachable(node, address, e)))?;
    let mut response = HttpResponse::build(status);
    for (name, value) in answer.headers() {
        if !hop_by_hop_str(name.as_str()) && name.as_str() != "content-length" {
            response.append_header((name.as_str(), value.as_bytes()));
        }
    }
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok(response.finish());
    }
    let length = answer.content_length();
    let chunks = answer
        .bytes_stream()
        .map(|chunk| chunk.map_err(|e| std::io::Error::other(e.to_string())));
    // The owner lost mid-answer: the body ends in an error (the connection is
    // cut), so that a client cannot take a cut answer for a whole one.
    let stream = futures_util::stream::unfold(
        (Box::pin(chunks), lost, false),
        |(mut chunks, mut lost, ended)| async move {
            if ended {
                return None;
            }
            tokio::select! {
                chunk = chunks.next() => chunk.map(|c| (c, (chunks, lost, false))),
                why = &mut lost => Some((
                    Err(std::io::Error::other(why)),
                    (chunks, lost, true),
                )),
            }
        },
    );
    if let Some(n) = length {
        response.no_chunking(n);
    }
    Ok(response.streaming(stream))
}

/// Resolves once the fleet counts `node` lost, with why (never without a fleet).
fn owner_lost(state: &State, node: &str) -> futures_util::future::BoxFuture<'static, String> {
    match state.paddock.federation().cloned() {
        Some(f) => {
            let node = node.to_string();
            Box::pin(async move { f.node_lost(&node).await })
        }
        None => Box::pin(std::future::pending()),
    }
}

/// The answer to a call whose owner was lost while it was on the way.
fn lost_error(node: &str, why: &str) -> Error {
    Error::new(
        ErrorCode::NodeLost,
        format!(
            "the node that owns the sandbox, `{node}`, was lost while this call was on it \
             ({why}); what the sandbox held is gone: open a new sandbox"
        ),
    )
}

fn hop_by_hop_str(name: &str) -> bool {
    HeaderName::from_bytes(name.as_bytes()).is_ok_and(|n| hop_by_hop(&n))
}

/// This node's id in the fleet, for [`FORWARDED_HEADER`].
fn this_node(state: &State) -> String {
    state
        .paddock
        .federation()
        .map(|f| f.node_id())
        .unwrap_or_default()
}

/// Relays a WebSocket: the owner is asked first, so that its refusal (an unknown
/// process, nothing listening on the port) is the caller's plain HTTP answer; only
/// once the owner took the upgrade does this node take the client's.
async fn forward_socket(
    state: &State,
    caller: &Caller,
    req: &HttpRequest,
    payload: web::Payload,
    node: &str,
    address: &str,
    path: &str,
) -> Result<HttpResponse, ApiError> {
    use tungstenite::client::IntoClientRequest;
    let held = state
        .gate
        .enter_websocket(&super::gate::Holder::of(caller))
        .map_err(ApiError::from)?;
    let ws_base = address
        .strip_prefix("http")
        .map(|rest| format!("ws{rest}"))
        .ok_or_else(|| unreachable(node, address, "the address is not http://"))?;
    let mut request = format!("{ws_base}{path}")
        .into_client_request()
        .map_err(|e| unreachable(node, address, e))?;
    for (name, value) in req.headers() {
        let n = name.as_str();
        // The handshake is this node's own with the owner (no subprotocol: the
        // routes take none, and the client's answer comes from this node).
        if hop_by_hop(name) || n.starts_with("sec-websocket-") {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            tungstenite::http::HeaderName::from_bytes(n.as_bytes()),
            tungstenite::http::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            request.headers_mut().append(name, value);
        }
    }
    if let Ok(v) = tungstenite::http::HeaderValue::from_str(&this_node(state)) {
        request.headers_mut().insert(FORWARDED_HEADER, v);
    }
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_WS_MESSAGE))
        .max_frame_size(Some(MAX_WS_MESSAGE));
    let connected = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_tungstenite::connect_async_with_config(request, Some(config), true),
    )
    .await;
    let upstream = match connected {
        Err(_) => return Err(unreachable(node, address, "timed out")),
        Ok(Err(tungstenite::Error::Http(refused))) => {
            // The owner answered without upgrading: its answer is the caller's.
            let status =
                StatusCode::from_u16(refused.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut response = HttpResponse::build(status);
            for (name, value) in refused.headers() {
                let n = name.as_str();
                if !hop_by_hop_str(n) && n != "content-length" {
                    response.append_header((n, value.as_bytes()));
                }
            }
            return Ok(response.body(refused.body().clone().unwrap_or_default()));
        }
        Ok(Err(e)) => return Err(unreachable(node, address, e)),
        Ok(Ok((upstream, _))) => upstream,
    };
    let (response, session, stream) = actix_ws::handle(req, payload).map_err(upgrade_error)?;
    let stream = stream
        .max_frame_size(MAX_WS_MESSAGE)
        .aggregate_continuations()
        .max_continuation_size(MAX_WS_MESSAGE);
    let lost = owner_lost(state, node);
    actix_web::rt::spawn(async move {
        // The tenant's place among its open WebSockets, until this one closes.
        let _held = held;
        relay_socket(upstream, session, stream, lost).await
    });
    Ok(super::wake_at_end(response, state.close_linger()))
}

type Upstream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How long a close from one side waits for the other side's close to pass back.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Messages both ways until either side closes; a close is passed on and the
/// other side's answer to it passed back.
async fn relay_socket(
    upstream: Upstream,
    session: actix_ws::Session,
    mut stream: actix_ws::AggregatedMessageStream,
    mut lost: futures_util::future::BoxFuture<'static, String>,
) {
    let (mut to_owner, mut from_owner) = upstream.split();
    let mut down = {
        let mut session = session.clone();
        actix_web::rt::spawn(async move {
            while let Some(message) = from_owner.next().await {
                let sent = match message {
                    Ok(tungstenite::Message::Binary(data)) => session.binary(data).await,
                    Ok(tungstenite::Message::Text(text)) => {
                        session.text(text.as_str().to_owned()).await
                    }
                    Ok(tungstenite::Message::Close(frame)) => {
                        let reason = frame.map(|f| CloseReason {
                            code: CloseCode::from(u16::from(f.code)),
                            description: (!f.reason.is_empty())
                                .then(|| f.reason.as_str().to_owned()),
                        });
                        let _ = session.close(reason).await;
                        return;
                    }
                    // Pings are answered by the client library; pongs are ours.
                    Ok(_) => Ok(()),
                    Err(_) => break,
                };
                if sent.is_err() {
                    return;
                }
            }
            // The owner went away without a close.
            let _ = session
                .close(Some(CloseReason {
                    code: CloseCode::Away,
                    description: Some("the node that owns the sandbox went away".into()),
                }))
                .await;
        })
    };
    let mut replies = session;
    let lost_close = |why: String| {
        Some(CloseReason {
            code: CloseCode::Away,
            description: Some(format!("the node that owns the sandbox was lost ({why})")),
        })
    };
    loop {
        let message = tokio::select! {
            m = stream.next() => m,
            // The owner closed (and that close went to the client).
            _ = &mut down => return,
            // The owner stopped answering, and the fleet counts it lost.
            why = &mut lost => {
                down.abort();
                let _ = replies.close(lost_close(why)).await;
                return;
            }
        };
        let out = match message {
            Some(Ok(AggregatedMessage::Binary(data))) => tungstenite::Message::Binary(data),
            Some(Ok(AggregatedMessage::Text(text))) => {
                tungstenite::Message::Text(text.to_string().into())
            }
            Some(Ok(AggregatedMessage::Ping(p))) => {
                let _ = replies.pong(&p).await;
                continue;
            }
            Some(Ok(AggregatedMessage::Pong(_))) => continue,
            Some(Ok(AggregatedMessage::Close(reason))) => {
                let frame = reason.map(|r| tungstenite::protocol::CloseFrame {
                    code: tungstenite::protocol::frame::coding::CloseCode::from(u16::from(r.code)),
                    reason: r.description.unwrap_or_default().into(),
                });
                let close = to_owner.send(tungstenite::Message::Close(frame));
                let _ = tokio::time::timeout(CLOSE_WAIT, close).await;
                // Nothing more is read from the client, so the server ends the
                // connection as soon as the close answer is out.
                drop(stream);
                if tokio::time::timeout(CLOSE_WAIT, &mut down).await.is_err() {
                    down.abort();
                    let _ = replies.close(None).await;
                }
                return;
            }
            Some(Err(_)) | None => break,
        };
        // A send to an owner that stopped reading blocks once the buffers are
        // full: it ends when the fleet counts the owner lost.
        let sent = tokio::select! {
            r = to_owner.send(out) => r,
            why = &mut lost => {
                down.abort();
                let _ = replies.close(lost_close(why)).await;
                return;
            }
        };
        if sent.is_err() {
            break;
        }
    }
    down.abort();
    let _ = tokio::time::timeout(CLOSE_WAIT, to_owner.close()).await;
    let _ = replies.close(None).await;
}

#[cfg(test)]
mod tests {
    use super::sandbox_in;

    #[test]
    fn the_sandbox_of_a_path() {
        assert_eq!(sandbox_in("/v1/sandboxes/abc"), Some("abc"));
        assert_eq!(sandbox_in("/v1/sandboxes/abc/files/x/y"), Some("abc"));
        assert_eq!(sandbox_in("/v1/sandboxes/"), None);
        assert_eq!(sandbox_in("/v1/sandboxes"), None);
        assert_eq!(sandbox_in("/v1/executions/abc"), None);
    }
}
