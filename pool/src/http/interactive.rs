//! Background processes, terminals and TCP streams over HTTP: JSON routes to start,
//! list and signal them, and WebSocket routes to attach to them (see
//! `docs/http-api.md`, "Interactive sandboxes", for the message framing).

use actix_web::{web, HttpRequest, HttpResponse};
use actix_ws::{AggregatedMessage, CloseCode, CloseReason};
use bytes::Bytes;
use futures_util::StreamExt;
use paddock_core::input::InputWait;
use paddock_core::{Error, ProcessSpec, StreamKind, TcpTarget, TerminalSize, TerminalSpec};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::answers::{ProcessList, Signalled};
use super::{parse_body, sandbox_access, ApiError, Shared};
use crate::messages::Started;
use crate::Caller;

/// The largest WebSocket message accepted from a client.
pub const MAX_WS_MESSAGE: usize = 1 << 20;
/// The first byte of an output message: which stream it carries.
const STDOUT_TAG: u8 = 1;
const STDERR_TAG: u8 = 2;

pub(super) async fn start_process(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let handle = sandbox_access(&state, &caller, &path, "sandbox.process.start").await?;
    let spec: ProcessSpec = parse_body(&state, payload).await?;
    let started = handle.start_process(spec).await?;
    Ok(HttpResponse::Created().json(started.info))
}

pub(super) async fn open_terminal(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let handle = sandbox_access(&state, &caller, &path, "sandbox.terminal.open").await?;
    let spec: TerminalSpec = parse_body(&state, payload).await?;
    let started = handle.open_terminal(spec).await?;
    Ok(HttpResponse::Created().json(started.info))
}

pub(super) async fn list_processes(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let handle = sandbox_access(&state, &caller, &path, "sandbox.process.list").await?;
    let list = handle.processes().await?;
    Ok(HttpResponse::Ok().json(ProcessList { processes: list }))
}

/// The process, for a caller allowed to use its sandbox.
async fn find(
    state: &Shared,
    caller: &Caller,
    path: web::Path<(String, String)>,
    action: &'static str,
) -> Result<Started, ApiError> {
    let (sandbox, process) = path.into_inner();
    let handle = sandbox_access(state, caller, &sandbox, action).await?;
    Ok(handle.process(&process).await?)
}

pub(super) async fn get_process(
    state: Shared,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let started = find(&state, &caller, path, "sandbox.process.get").await?;
    Ok(HttpResponse::Ok().json(started.info))
}

/// A signal by name (`"TERM"`, `"SIGINT"`) or number.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub(super) enum SignalValue {
    /// A signal number.
    Number(#[schemars(range(min = 1, max = paddock_core::interactive::MAX_SIGNAL))] i32),
    /// A signal name, with or without `SIG` (`TERM`, `SIGINT`), in any case.
    Name(String),
}

impl SignalValue {
    fn number(&self) -> Result<i32, Error> {
        match self {
            SignalValue::Number(n) => paddock_core::interactive::check_signal(*n),
            SignalValue::Name(s) => paddock_core::interactive::parse_signal(s),
        }
    }
}

/// The body of `POST /v1/sandboxes/{id}/processes/{process}/signal`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SignalBody {
    /// The signal to send to the process's group.
    signal: SignalValue,
}

pub(super) async fn signal_process(
    state: Shared,
    caller: Caller,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let started = find(&state, &caller, path, "sandbox.process.signal").await?;
    let body: SignalBody = parse_body(&state, payload).await?;
    let signal = body.signal.number()?;
    started.handle.shared().control().signal(signal)?;
    Ok(HttpResponse::Ok().json(Signalled { signal }))
}

/// Input bytes an attach socket queues for a process that is not reading.
const MAX_PENDING_INPUT: usize = 1 << 20;

/// Input for the process, in the order the client sent it.
enum Input {
    Data(Bytes),
    Close,
}

type WriteFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Error>> + Send>>;

/// What a client sends as a text message on an attach socket.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ClientMessage {
    /// Close the process's stdin (a terminal gets Ctrl-D).
    CloseStdin,
    /// Send a signal to the process's group.
    Signal { signal: SignalValue },
    /// Resize the terminal.
    Resize { rows: u16, cols: u16 },
}

/// `GET /v1/sandboxes/{id}/processes/{process}/attach`: a WebSocket to a process or
/// terminal. The process is looked up before the upgrade, so an unknown one is a
/// plain 404.
pub(super) async fn attach(
    state: Shared,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let started = find(&state, &caller, path, "sandbox.process.attach").await?;
    let held = state
        .gate
        .enter_websocket(&super::gate::Holder::of(&caller))
        .map_err(ApiError::from)?;
    let (response, session, stream) = actix_ws::handle(&req, body).map_err(upgrade_error)?;
    let stream = stream
        .max_frame_size(MAX_WS_MESSAGE)
        .aggregate_continuations()
        .max_continuation_size(MAX_WS_MESSAGE);
    actix_web::rt::spawn(async move {
        // The tenant's place among its open WebSockets, until this one closes.
        let _held = held;
        relay_process(started, session, stream).await
    });
    Ok(super::wake_at_end(response, state.close_linger()))
}

pub(super) fn upgrade_error(e: actix_web::Error) -> ApiError {
    ApiError::from(Error::invalid_options(
        "upgrade",
        format!("this route speaks WebSocket: send an upgrade request ({e})"),
    ))
}

/// Output to the client (tagged binary messages, then the exit as a text message and
/// a normal close); input and commands from the client. The client leaving detaches:
/// the process keeps running.
async fn relay_process(
    started: Started,
    session: actix_ws::Session,
    mut stream: actix_ws::AggregatedMessageStream,
) {
    let shared = started.handle.shared().clone();
    let terminal = matches!(started.handle, crate::messages::Attachable::Terminal(_));
    let output = {
        let shared = shared.clone();
        let mut session = session.clone();
        actix_web::rt::spawn(async move {
            let mut reader = shared.output();
            while let Some(chunk) = reader.next().await {
                let tag = match chunk.stream {
                    StreamKind::Stdout => STDOUT_TAG,
                    StreamKind::Stderr => STDERR_TAG,
                };
                let mut message = Vec::with_capacity(chunk.data.len() + 1);
                message.push(tag);
                message.extend_from_slice(&chunk.data);
                if session.binary(Bytes::from(message)).await.is_err() {
                    return;
                }
            }
            let exit = shared.wait().await;
            let _ = session
                .text(
                    serde_json::json!({
                        "type": "exit",
                        "exit_code": exit.exit_code,
                        "signal": exit.signal,
                    })
                    .to_string(),
                )
                .await;
            let _ = session
                .close(Some(CloseReason {
                    code: CloseCode::Normal,
                    description: Some("the process exited".into()),
                }))
                .await;
        })
    };
    let mut replies = session;
    // Input waits here while the process is not reading, up to MAX_PENDING_INPUT
    // bytes; past that the socket is not read until it drains (the client's own
    // socket buffer then holds it back). Each chunk then waits for room in the
    // process's input buffer and its tenant's budget, for as long as it takes: the
    // socket is not read meanwhile. Signals and resizes are not queued.
    let mut pending: std::collections::VecDeque<Input> = std::collections::VecDeque::new();
    let mut pending_bytes = 0usize;
    let mut writing: Option<WriteFuture> = None;
    // The client's close, once it came.
    let mut closing = None;
    loop {
        if writing.is_none() {
            if let Some(next) = pending.pop_front() {
                let shared = shared.clone();
                writing = Some(match next {
                    Input::Data(data) => {
                        pending_bytes -= data.len();
                        Box::pin(async move {
                            shared
                                .send_input(Vec::from(data), InputWait::Unbounded)
                                .await
                        })
                    }
                    // A terminal has no stdin to close: it gets Ctrl-D, in order.
                    Input::Close if terminal => Box::pin(async move {
                        shared.send_input(vec![0x04], InputWait::Unbounded).await
                    }),
                    Input::Close => Box::pin(async move {
                        shared.close_input();
                        Ok(())
                    }),
                });
            }
        }
        let result = tokio::select! {
            done = async { writing.as_mut().expect("guarded").await }, if writing.is_some() => {
                writing = None;
                done
            }
            message = stream.next(), if pending_bytes < MAX_PENDING_INPUT => match message {
                Some(Ok(AggregatedMessage::Binary(data))) => {
                    pending_bytes += data.len();
                    pending.push_back(Input::Data(data));
                    Ok(())
                }
                Some(Ok(AggregatedMessage::Text(text))) => match serde_json::from_str::<ClientMessage>(&text) {
                    Ok(ClientMessage::CloseStdin) => {
                        // In order, after the input sent before it.
                        pending.push_back(Input::Close);
                        Ok(())
                    }
                    Ok(ClientMessage::Signal { signal }) => signal
                        .number()
                        .and_then(|s| shared.control().signal(s)),
                    Ok(ClientMessage::Resize { rows, cols }) => {
                        let size = TerminalSize { rows, cols };
                        size.validate().and_then(|_| shared.control().resize(size))
                    }
                    Err(e) => Err(Error::invalid_options(
                        "message",
                        format!("{e}; send {{\"type\":\"close_stdin\"}}, {{\"type\":\"signal\",\"signal\":\"TERM\"}} or {{\"type\":\"resize\",\"rows\":24,\"cols\":80}}"),
                    )),
                },
                Some(Ok(AggregatedMessage::Ping(p))) => {
                    let _ = replies.pong(&p).await;
                    Ok(())
                }
                Some(Ok(AggregatedMessage::Pong(_))) => Ok(()),
                Some(Ok(AggregatedMessage::Close(reason))) => {
                    closing = Some(reason);
                    break;
                }
                Some(Err(_)) | None => break,
            },
        };
        if let Err(e) = result {
            // Answered, not fatal: the socket stays open.
            let _ = replies
                .text(
                    serde_json::json!({
                        "type": "error",
                        "code": e.code,
                        "message": e.message,
                    })
                    .to_string(),
                )
                .await;
        }
    }
    // The client left: stop relaying; the process runs on.
    output.abort();
    if let Some(reason) = closing {
        answer_close(stream, replies, reason).await;
    }
}

/// Answers the client's close. The incoming stream goes first, so that when the
/// response ends with the close frame the server sees nothing more to read and ends
/// the connection at once (with the stream still held, it would wait for the
/// keep-alive timer or the client, which waits for the server).
async fn answer_close(
    stream: actix_ws::AggregatedMessageStream,
    session: actix_ws::Session,
    reason: Option<CloseReason>,
) {
    drop(stream);
    let _ = session.close(reason).await;
}

/// The query of `GET /v1/sandboxes/{id}/tcp/{port}`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TcpQuery {
    /// The guest's loopback address to connect to: `127.0.0.1` (default), any
    /// `127.x.y.z`, `::1` or `localhost`.
    #[serde(default)]
    host: Option<String>,
}

/// `GET /v1/sandboxes/{id}/tcp/{port}`: a WebSocket carrying a TCP stream to a
/// service on the guest's loopback. The connection is made before the upgrade, so a
/// refusal (nothing listening, a host that is not loopback) is a plain error.
pub(super) async fn tcp(
    state: Shared,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    query: web::Query<TcpQuery>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (sandbox, port) = path.into_inner();
    let handle = sandbox_access(&state, &caller, &sandbox, "sandbox.tcp").await?;
    let port: u16 = port.parse().map_err(|_| {
        Error::invalid_options("port", format!("{port:?} is not a port; use 1 to 65535"))
    })?;
    let target = TcpTarget {
        port,
        host: query
            .into_inner()
            .host
            .unwrap_or_else(|| "127.0.0.1".into()),
    };
    // Refused here (before any upgrade) when the host is not loopback.
    target.loopback_addr()?;
    if !is_upgrade(&req) {
        return Err(upgrade_error(actix_web::error::ErrorBadRequest(
            "no upgrade",
        )));
    }
    let held = state
        .gate
        .enter_websocket(&super::gate::Holder::of(&caller))
        .map_err(ApiError::from)?;
    let conn = handle.open_tcp_connection(target).await?;
    let (response, session, stream) = actix_ws::handle(&req, body).map_err(upgrade_error)?;
    let stream = stream
        .max_frame_size(MAX_WS_MESSAGE)
        .aggregate_continuations()
        .max_continuation_size(MAX_WS_MESSAGE);
    actix_web::rt::spawn(async move {
        // The tenant's place among its open WebSockets, until this one closes.
        let _held = held;
        relay_tcp(conn, session, stream).await
    });
    Ok(super::wake_at_end(response, state.close_linger()))
}

/// Whether `req` asks for a WebSocket.
pub fn is_upgrade(req: &HttpRequest) -> bool {
    req.headers()
        .get(actix_web::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Bytes both ways until either side ends.
async fn relay_tcp(
    conn: paddock_core::TcpConnection,
    session: actix_ws::Session,
    mut stream: actix_ws::AggregatedMessageStream,
) {
    let (mut from_guest, mut to_guest) = conn.stream.into_split();
    let down = {
        let mut session = session.clone();
        actix_web::rt::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from_guest.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if session
                            .binary(Bytes::copy_from_slice(&buf[..n]))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
            let _ = session
                .close(Some(CloseReason {
                    code: CloseCode::Normal,
                    description: Some("the guest closed the connection".into()),
                }))
                .await;
        })
    };
    let mut replies = session;
    while let Some(message) = stream.next().await {
        match message {
            Ok(AggregatedMessage::Binary(data)) => {
                if to_guest.write_all(&data).await.is_err() {
                    break;
                }
            }
            Ok(AggregatedMessage::Text(text)) => {
                if to_guest.write_all(text.as_bytes()).await.is_err() {
                    break;
                }
            }
            Ok(AggregatedMessage::Ping(p)) => {
                let _ = replies.pong(&p).await;
            }
            Ok(AggregatedMessage::Pong(_)) => {}
            Ok(AggregatedMessage::Close(reason)) => {
                // The close handshake, answered at once; the guest's connection ends
                // with it (a WebSocket has no half-close: a client that wants the
                // guest's answer reads it before it closes).
                down.abort();
                let _ = to_guest.shutdown().await;
                answer_close(stream, replies, reason).await;
                return;
            }
            Err(_) => break,
        }
    }
    // The client went away without a close: the guest reads end of file.
    down.abort();
    let _ = to_guest.shutdown().await;
}
