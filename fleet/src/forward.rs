//! The fleet's forwarding of HTTP calls: a call on a sandbox another node owns is
//! sent to the owner's HTTP API and its answer streamed back; a WebSocket is relayed
//! message by message. The native HTTP surface decides which calls go (and takes a
//! WebSocket's place in its gate); this module sends them
//! ([`HttpForwarder`](paddock_pool::http::HttpForwarder)).
//!
//! The forwarded request carries the caller's own credentials: the owner
//! authenticates it again and applies its own walls. It also carries
//! [`FORWARDED_HEADER`] (the forwarding node's id), and a request with that header
//! is answered by the node it reaches, without routing it again. A call whose owner
//! stops answering ends once the fleet counts the owner lost (`NODE_LOST`), not when
//! TCP gives up.

use std::time::Duration;

use actix_web::http::header::HeaderName;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use actix_ws::{AggregatedMessage, CloseCode, CloseReason};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use paddock_core::{Error, ErrorCode};
use paddock_pool::http::{
    is_upgrade, wake_at_end, Forward, ForwardBody as Body, HttpForwarder, Unanswered,
    FORWARDED_HEADER, MAX_WS_MESSAGE,
};
use tokio_tungstenite::tungstenite;

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

/// The fleet's [`HttpForwarder`]: plain HTTP/1.1 to the owner's address.
#[derive(Debug, Default)]
pub(crate) struct NodeForwarder;

#[async_trait::async_trait(?Send)]
impl HttpForwarder for NodeForwarder {
    async fn forward(&self, call: Forward<'_>) -> Result<HttpResponse, Unanswered> {
        forward_to(call).await
    }
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
fn unreachable(node: &str, address: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::FleetUnavailable,
        format!(
            "the sandbox is on node `{node}`, which did not answer at {address} ({e}); \
             retry shortly (once the fleet counts the node as lost, its sandboxes \
             answer NODE_LOST)"
        ),
    )
    .with_retry_after_ms(1_000)
}

/// Forwards one call to its owner and streams the answer back, telling a call that
/// never reached the owner from one that may have.
async fn forward_to(call: Forward<'_>) -> Result<HttpResponse, Unanswered> {
    let Forward {
        req,
        body,
        node,
        address,
        from,
        lost,
        websocket,
        close_linger,
    } = call;
    let not_sent = |error: Error| Unanswered { error, sent: false };
    let sent = |error: Error| Unanswered { error, sent: true };
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    if is_upgrade(req) {
        let Body::Stream(payload) = body else {
            return Err(not_sent(Error::invalid_options(
                "upgrade",
                "a WebSocket cannot be forwarded with a read body",
            )));
        };
        let socket = Socket {
            from,
            lost,
            place: websocket,
            close_linger,
        };
        return forward_socket(req, payload, node, address, path, socket)
            .await
            .map_err(sent);
    }
    let client = CLIENT
        .with(Clone::clone)
        .ok_or_else(|| not_sent(unreachable(node, address, "no HTTP client could be built")))?;
    let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes())
        .map_err(|e| not_sent(Error::invalid_options("method", e.to_string())))?;
    let mut out = client.request(method, format!("{address}{path}"));
    for (name, value) in req.headers() {
        if !hop_by_hop(name) {
            out = out.header(name.as_str(), value.as_bytes());
        }
    }
    out = out.header(FORWARDED_HEADER, from);
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
    let mut lost = lost;
    let answer = tokio::select! {
        a = out.send() => a.map_err(|e| Unanswered {
            sent: !e.is_connect(),
            error: unreachable(node, address, e),
        }),
        why = &mut lost => Err(sent(lost_error(node, &why))),
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

/// What relaying a WebSocket needs besides the request.
struct Socket {
    /// This node's id, for [`FORWARDED_HEADER`].
    from: String,
    /// Resolves once the fleet counts the owner lost.
    lost: BoxFuture<'static, String>,
    /// The caller's place among its open WebSockets, held while the relay lasts.
    place: Option<paddock_pool::http::Place>,
    close_linger: Duration,
}

/// Relays a WebSocket: the owner is asked first, so that its refusal (an unknown
/// process, nothing listening on the port) is the caller's plain HTTP answer; only
/// once the owner took the upgrade does this node take the client's.
async fn forward_socket(
    req: &HttpRequest,
    payload: web::Payload,
    node: &str,
    address: &str,
    path: &str,
    socket: Socket,
) -> Result<HttpResponse, Error> {
    use tungstenite::client::IntoClientRequest;
    let Socket {
        from,
        lost,
        place,
        close_linger,
    } = socket;
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
    if let Ok(v) = tungstenite::http::HeaderValue::from_str(&from) {
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
    let (response, session, stream) = actix_ws::handle(req, payload).map_err(|e| {
        Error::invalid_options(
            "upgrade",
            format!("this route speaks WebSocket: send an upgrade request ({e})"),
        )
    })?;
    let stream = stream
        .max_frame_size(MAX_WS_MESSAGE)
        .aggregate_continuations()
        .max_continuation_size(MAX_WS_MESSAGE);
    actix_web::rt::spawn(async move {
        // The tenant's place among its open WebSockets, until this one closes.
        let _held = place;
        relay_socket(upstream, session, stream, lost).await
    });
    Ok(wake_at_end(response, close_linger))
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
