//! Requests to any other port of a sandbox (`get_host(port)`, or the
//! `E2b-Sandbox-Port` header): forwarded as HTTP/1.1 to that port on the guest's
//! loopback, over the session's TCP-into-guest path, and the answer streamed back.
//!
//! As on E2B, these ports take the sandbox's traffic token (`E2B-Traffic-Access-Token`)
//! unless the sandbox was created with `network.allowPublicTraffic: true`, when whoever
//! has its address reaches them (see [`crate::access`]; the routing has checked it
//! before a request comes here). The egress gateway's ports in a sandbox with a
//! network (its proxy 3128, transparent path 15001 and DNS 53) are never forwarded:
//! the engines refuse a stream to them, and the answer is 403.
//!
//! A WebSocket upgrade is forwarded as such: the upgrade request goes to the
//! sandbox's server, and when it answers `101 Switching Protocols` the two
//! connections are joined, byte for byte, until either side closes (or the sandbox
//! ends). Other upgrades (`h2c`, say) are refused with 501.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use paddock_core::TcpTarget;
use paddock_pool::http::{Holder, Place, RequestGate};

use crate::files::http_error;
use crate::registry::Sbx;

/// How long a request's body may take to arrive.
const BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the sandbox's server may take to begin its answer.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Headers that belong to one connection, not to the request or answer.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Headers of E2B's own addressing, not passed to the sandbox's server.
fn addressing(name: &str) -> bool {
    name.starts_with("e2b-") || name == "x-access-token"
}

/// Forwards `req` (with its body, at most `max_body` bytes) to `port` of the
/// sandbox's loopback; `linger` is the server's `close_linger_ms`. A WebSocket takes
/// a place among the sandbox's in the listener's gate
/// (`server.max_websockets_per_tenant` per sandbox) until it closes.
pub(crate) async fn forward(
    sbx: Arc<Sbx>,
    req: &HttpRequest,
    mut payload: web::Payload,
    port: u16,
    (max_body, linger): (usize, std::time::Duration),
) -> HttpResponse {
    let not_open = || {
        crate::errors::proxy_error(
            &sbx.id,
            "The sandbox is running but port is not open",
            format!("nothing listens on port {port} of the sandbox: start a server listening on it first"),
        )
    };
    let websocket = match req.headers().get("upgrade") {
        None => false,
        Some(v) if v.as_bytes().eq_ignore_ascii_case(b"websocket") => true,
        Some(v) => {
            return http_error(
                StatusCode::NOT_IMPLEMENTED,
                format!(
                    "only WebSocket upgrades are forwarded to a sandbox's ports, not `{}`",
                    String::from_utf8_lossy(v.as_bytes())
                ),
            )
        }
    };
    if port == 0 {
        return not_open();
    }
    // A WebSocket holds its place among the sandbox's until it closes (they need
    // no token, so they are counted per sandbox, like its other public requests).
    let place = if websocket {
        let Some(gate) = req.app_data::<web::Data<RequestGate>>() else {
            return http_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the listener's request gate is missing from this route",
            );
        };
        match gate.enter_websocket(&Holder::Sandbox(sbx.id.clone())) {
            Ok(p) => Some(p),
            Err(_) => {
                return http_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "{} WebSockets to this sandbox's ports are open (server.max_websockets_per_tenant); close one first",
                        gate.max_websockets()
                    ),
                )
            }
        }
    } else {
        None
    };
    let conn = match sbx
        .handle
        .open_tcp_connection(TcpTarget::loopback(port))
        .await
    {
        Ok(c) => c,
        Err(e) if e.code == paddock_core::ErrorCode::NotFound => return not_open(),
        // The egress gateway's ports (the engine names the port in its message).
        Err(e) if e.code == paddock_core::ErrorCode::InvalidOptions => {
            return http_error(StatusCode::FORBIDDEN, e.message)
        }
        Err(e) => {
            tracing::debug!(error = %e, port, "connecting into the sandbox failed");
            return not_open();
        }
    };
    // The body, read whole within a bound: a client that trickles it holds no
    // place for long.
    let read = async {
        let mut body = Vec::new();
        while let Some(piece) = payload.next().await {
            let Ok(piece) = piece else {
                return Err(http_error(
                    StatusCode::BAD_REQUEST,
                    "the request body ended early",
                ));
            };
            if body.len() + piece.len() > max_body {
                return Err(http_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body is larger than server.max_body_bytes ({max_body} bytes)"),
                ));
            }
            body.extend_from_slice(&piece);
        }
        Ok(body)
    };
    // An upgrade's payload is the connection itself, after the answer: nothing is
    // read before.
    let read = async {
        if websocket {
            Ok(Vec::new())
        } else {
            read.await
        }
    };
    let body = match tokio::time::timeout(BODY_WAIT, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(answer)) => return answer,
        Err(_) => {
            return http_error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body took longer than {} s",
                    BODY_WAIT.as_secs()
                ),
            )
        }
    };
    let io = hyper_util::rt::TokioIo::new(conn.stream);
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake::<_, http_body_util::Full<bytes::Bytes>>(io)
            .await
        {
            Ok(pair) => pair,
            Err(_) => return not_open(),
        };
    actix_web::rt::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut builder = hyper::Request::builder()
        .method(req.method().as_str())
        .uri(path);
    let mask = sbx
        .mask_host
        .as_deref()
        .map(|m| m.replace("${PORT}", &port.to_string()));
    for (name, value) in req.headers() {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || addressing(n) || (n == "host" && mask.is_some()) {
            continue;
        }
        builder = builder.header(n, value.as_bytes());
    }
    if let Some(mask) = &mask {
        // `maskRequestHost`: the Host the sandbox's server sees.
        builder = builder.header("host", mask.as_str());
    }
    if websocket {
        builder = builder
            .header("connection", "upgrade")
            .header("upgrade", "websocket");
    }
    let Ok(request) = builder.body(http_body_util::Full::new(bytes::Bytes::from(body))) else {
        return http_error(
            StatusCode::BAD_REQUEST,
            "the request could not be forwarded",
        );
    };
    let answer = match tokio::time::timeout(ANSWER_WAIT, sender.send_request(request)).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            return http_error(
                StatusCode::BAD_GATEWAY,
                format!("the server on port {port} of the sandbox gave no answer: {e}"),
            )
        }
        Err(_) => {
            return http_error(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "the server on port {port} of the sandbox began no answer within {} s",
                    ANSWER_WAIT.as_secs()
                ),
            )
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut out = HttpResponse::build(status);
    for (name, value) in answer.headers() {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || n == "content-length" {
            continue;
        }
        out.append_header((n, value.as_bytes()));
    }
    if websocket && status == StatusCode::SWITCHING_PROTOCOLS {
        return match hyper::upgrade::on(answer).await {
            Ok(upgraded) => join(out, upgraded, payload, linger, place),
            Err(e) => http_error(
                StatusCode::BAD_GATEWAY,
                format!("the server on port {port} of the sandbox did not switch protocols: {e}"),
            ),
        };
    }
    let stream = answer.into_body().into_data_stream().map(|piece| {
        piece.map_err(|e| actix_web::error::ErrorBadGateway(format!("the sandbox's server: {e}")))
    });
    out.streaming(stream)
}

/// The answer to a WebSocket upgrade the sandbox's server accepted: `101` with its
/// headers, then the server's bytes as they come, while the client's (the request's
/// payload, which after a WebSocket upgrade is the rest of the connection) are
/// written to the server. Either side closing ends both.
fn join(
    mut out: actix_web::HttpResponseBuilder,
    upgraded: hyper::upgrade::Upgraded,
    mut payload: web::Payload,
    linger: std::time::Duration,
    place: Option<Place>,
) -> HttpResponse {
    use tokio::io::AsyncWriteExt;
    let (from_server, mut to_server) = tokio::io::split(hyper_util::rt::TokioIo::new(upgraded));
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    actix_web::rt::spawn(async move {
        // Ends when the client's side ends, or when the answer's stream is dropped
        // (the server's side ended, or the client went away).
        let copy = async {
            while let Some(Ok(piece)) = payload.next().await {
                if to_server.write_all(&piece).await.is_err() {
                    break;
                }
            }
        };
        tokio::select! {
            () = copy => {}
            _ = closed_rx => {}
        }
        let _ = to_server.shutdown().await;
    });
    let bytes = tokio_util::io::ReaderStream::new(from_server);
    // The sender goes with the stream (at its end, or with the answer), which stops
    // the client's copier.
    // The WebSocket's place among the sandbox's goes with it too: it is held while
    // the answer lasts (a client that only half-closes still holds it).
    let stream = futures_util::stream::unfold(
        (bytes, closed_tx, place),
        |(mut bytes, closed, place)| async move {
            let piece = bytes.next().await?;
            Some((
                piece.map_err(|e| {
                    actix_web::error::ErrorBadGateway(format!("the sandbox's server: {e}"))
                }),
                (bytes, closed, place),
            ))
        },
    );
    // Closed within the linger once the server's side has ended.
    paddock_pool::http::wake_at_end(out.upgrade("websocket").streaming(stream), linger)
}
