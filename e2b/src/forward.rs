//! Requests to any other port of a sandbox (`get_host(port)`, or the
//! `E2b-Sandbox-Port` header): forwarded as HTTP/1.1 to that port on the guest's
//! loopback, over the session's TCP-into-guest path, and the answer streamed back.
//!
//! Like E2B's own, these ports are reachable by anyone who knows the sandbox's id (a
//! URL one shares), without the sandbox's token. WebSocket upgrades are not
//! forwarded yet.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use paddock_core::TcpTarget;

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
/// sandbox's loopback.
pub(crate) async fn forward(
    sbx: Arc<Sbx>,
    req: &HttpRequest,
    mut payload: web::Payload,
    port: u16,
    max_body: usize,
) -> HttpResponse {
    let not_open = || {
        http_error(
            StatusCode::BAD_GATEWAY,
            format!(
                "The sandbox {} is running but port {port} is not open: start a server listening on it first",
                sbx.id
            ),
        )
    };
    if req.headers().contains_key("upgrade") {
        return http_error(
            StatusCode::NOT_IMPLEMENTED,
            "upgrades (WebSockets) to a sandbox's own ports are not forwarded yet",
        );
    }
    if port == 0 {
        return not_open();
    }
    let conn = match sbx
        .handle
        .open_tcp_connection(TcpTarget::loopback(port))
        .await
    {
        Ok(c) => c,
        Err(e) if e.code == paddock_core::ErrorCode::NotFound => return not_open(),
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
        let _ = connection.await;
    });
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut builder = hyper::Request::builder()
        .method(req.method().as_str())
        .uri(path);
    for (name, value) in req.headers() {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || addressing(n) {
            continue;
        }
        builder = builder.header(n, value.as_bytes());
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
    let stream = answer.into_body().into_data_stream().map(|piece| {
        piece.map_err(|e| actix_web::error::ErrorBadGateway(format!("the sandbox's server: {e}")))
    });
    out.streaming(stream)
}
