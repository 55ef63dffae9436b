//! `process.Process`: processes and terminals in a sandbox, as E2B's agent serves
//! them (Start, Connect, List, SendInput, StreamInput, SendSignal, CloseStdin,
//! Update).
//!
//! A process is a Paddock background process (a terminal when a `pty` is asked for)
//! of the sandbox's session, so the policy checks, the audit and the cap of every
//! process hold here too, and the session's process table is the only one: E2B
//! addresses processes by a `pid` (and an optional `tag`); a pid is the process's
//! number in its session from 1000 on ([`pid_of`]), since the pid inside a container
//! is not the host's. Unlike ids they need not be unguessable: E2B's protocol carries
//! a pid as a `uint32`, and a pid names a process only inside its own sandbox, on
//! routes that take that sandbox's access token.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt;
use paddock_core::interactive::ProcessShared;
use paddock_core::{ProcessSpec, StreamKind, TerminalSize, TerminalSpec};
use paddock_pool::{Attachable, ProcessInfo, ProcessSelector, Started};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::connect::{self, Code, ConnectError};
use crate::registry::Sbx;

/// The pid of a sandbox's first process: E2B's pid of a process is its number in
/// the session (counted from 1) plus 999.
const FIRST_PID: u32 = 1000;

/// The start of the tags of the processes this API runs for itself (a code
/// context's interpreter): the process service neither lists them nor starts one
/// with such a tag.
pub(crate) const RESERVED_TAG: &str = "paddock.";

/// E2B's pid of a process.
fn pid_of(info: &ProcessInfo) -> u32 {
    info.number.saturating_add(FIRST_PID - 1)
}

/// Most bytes of one request message (a stdin chunk is base64 inside it: 768 KiB of
/// input at most). Every agent call's body is read whole before it is handled, so
/// this, times a tenant's concurrent requests (`server.max_requests_per_tenant`),
/// bounds the memory its calls take while they are read; 1 MiB, as the native API's
/// JSON bodies and WebSocket messages.
pub(crate) const MAX_MESSAGE: usize = 1 << 20;
/// The keepalive interval when the client asks for none.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Selector {
    Pid(u32),
    Tag(String),
}

#[derive(Debug, Default, Deserialize)]
struct SelectorJson {
    pid: Option<u32>,
    tag: Option<String>,
}

impl SelectorJson {
    fn selector(self) -> Result<Selector, ConnectError> {
        match (self.pid, self.tag) {
            (Some(pid), None) => Ok(Selector::Pid(pid)),
            (None, Some(tag)) => Ok(Selector::Tag(tag)),
            _ => Err(ConnectError::invalid(
                "process: give exactly one of `pid` and `tag`",
            )),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct ProcessConfig {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Size {
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

#[derive(Debug, Default, Deserialize)]
struct Pty {
    #[serde(default)]
    size: Size,
}

#[derive(Debug, Default, Deserialize)]
struct StartRequest {
    #[serde(default)]
    process: Option<ProcessConfig>,
    #[serde(default)]
    pty: Option<Pty>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct SelectRequest {
    #[serde(default)]
    process: Option<SelectorJson>,
}

/// Input for a process: base64, borrowed from the request where it holds no JSON
/// escapes (so a large chunk is not copied before it is decoded).
#[derive(Debug, Default, Deserialize)]
struct InputJson<'a> {
    #[serde(default, borrow)]
    stdin: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    pty: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
struct SendInputRequest<'a> {
    #[serde(default)]
    process: Option<SelectorJson>,
    #[serde(default, borrow)]
    input: Option<InputJson<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct SendSignalRequest {
    #[serde(default)]
    process: Option<SelectorJson>,
    #[serde(default)]
    signal: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct UpdateRequest {
    #[serde(default)]
    process: Option<SelectorJson>,
    #[serde(default)]
    pty: Option<Pty>,
}

fn selector(s: Option<SelectorJson>) -> Result<Selector, ConnectError> {
    s.ok_or_else(|| ConnectError::invalid("give `process`: a `pid` or a `tag`"))?
        .selector()
}

/// The session's process `sel` names.
async fn find(sbx: &Sbx, sel: &Selector) -> Result<Started, ConnectError> {
    let which = match sel {
        Selector::Pid(pid) => match pid.checked_sub(FIRST_PID - 1) {
            Some(number) if number > 0 => ProcessSelector::Number(number),
            _ => return Err(not_found(sel)),
        },
        Selector::Tag(tag) => ProcessSelector::Tag(tag.clone()),
    };
    match sbx.handle.process_by(which).await {
        Err(e) if e.code == paddock_core::ErrorCode::NotFound => Err(not_found(sel)),
        other => Ok(other?),
    }
}

fn not_found(sel: &Selector) -> ConnectError {
    ConnectError::not_found(match sel {
        Selector::Pid(pid) => format!("process with pid {pid} not found"),
        Selector::Tag(tag) => format!("process with tag {tag} not found"),
    })
}

/// Decodes protobuf JSON bytes: standard or URL-safe base64, padded or not.
pub(crate) fn decode_bytes(field: &str, s: &str) -> Result<Vec<u8>, ConnectError> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|e| e.decode(s).ok())
        .ok_or_else(|| ConnectError::invalid(format!("{field}: not base64")))
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Dispatches a unary method of `process.Process`.
pub(crate) async fn unary(
    sbx: &Arc<Sbx>,
    method: &str,
    body: &[u8],
) -> Result<Value, ConnectError> {
    match method {
        "List" => {
            let running: Vec<Value> = sbx
                .handle
                .processes()
                .await?
                .iter()
                .filter(|p| p.exit.is_none())
                .filter(|p| {
                    !p.tag
                        .as_deref()
                        .is_some_and(|t| t.starts_with(RESERVED_TAG))
                })
                .map(|p| {
                    let (cmd, args) = p
                        .argv
                        .split_first()
                        .map_or(("", &[][..]), |(c, a)| (c.as_str(), a));
                    // The variables the start gave: those the sandbox's own do not hold.
                    let envs: BTreeMap<&String, &String> = p
                        .env
                        .iter()
                        .filter(|(k, v)| sbx.env.get(*k) != Some(*v))
                        .collect();
                    let config = json!({ "cmd": cmd, "args": args, "envs": envs, "cwd": p.cwd });
                    let mut v = json!({ "config": config, "pid": pid_of(p) });
                    if let Some(t) = &p.tag {
                        v["tag"] = json!(t);
                    }
                    v
                })
                .collect();
            Ok(json!({ "processes": running }))
        }
        "SendInput" => {
            let r: SendInputRequest = parse_borrowed(body)?;
            let p = find(sbx, &selector(r.process)?).await?;
            let input = r.input.unwrap_or_default();
            write_input(&p, input).await?;
            Ok(json!({}))
        }
        "SendSignal" => {
            let r: SendSignalRequest = connect::parse(body)?;
            let p = find(sbx, &selector(r.process)?).await?;
            let signal = match r.signal {
                Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => 9,
                Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => 15,
                Some(Value::Number(n)) if n.as_u64() == Some(9) || n.as_u64() == Some(15) => {
                    n.as_u64().unwrap_or(9) as i32
                }
                other => {
                    return Err(ConnectError::invalid(format!(
                        "signal {other:?}: use SIGNAL_SIGKILL or SIGNAL_SIGTERM"
                    )))
                }
            };
            p.handle.shared().control().signal(signal)?;
            Ok(json!({}))
        }
        "CloseStdin" => {
            let r: SelectRequest = connect::parse(body)?;
            let p = find(sbx, &selector(r.process)?).await?;
            match &p.handle {
                Attachable::Process(h) => h.close_stdin().await?,
                Attachable::Terminal(_) => {
                    return Err(ConnectError::invalid(
                        "a terminal's input is the pty; it has no stdin to close",
                    ))
                }
            }
            Ok(json!({}))
        }
        "Update" => {
            let r: UpdateRequest = connect::parse(body)?;
            let p = find(sbx, &selector(r.process)?).await?;
            let Some(pty) = r.pty else {
                return Ok(json!({}));
            };
            let size = TerminalSize {
                rows: pty.size.rows,
                cols: pty.size.cols,
            };
            size.validate()?;
            match &p.handle {
                Attachable::Terminal(t) => t.resize(size)?,
                Attachable::Process(_) => {
                    return Err(ConnectError::invalid(
                        "the process has no pty to resize; start it with `pty`",
                    ))
                }
            }
            Ok(json!({}))
        }
        _ => Err(ConnectError::new(
            Code::Unimplemented,
            format!("process.Process/{method} is not a method of this agent"),
        )),
    }
}

/// [`connect::parse`] for a request that borrows from its body.
fn parse_borrowed<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ConnectError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| ConnectError::invalid(format!("malformed request: {e}")))
}

/// Writes input to a process through its bounded input buffer: answered once the
/// bytes are buffered, `resource_exhausted` (`RATE_LIMITED`) when the process has
/// not read what it was sent within the buffer's wait, or the tenant's processes
/// hold their budget of unread input (see `limiter.max_input_bytes_per_process`).
async fn write_input(p: &Started, input: InputJson<'_>) -> Result<(), ConnectError> {
    let (data, to_pty) = match (input.stdin, input.pty) {
        (Some(d), None) => (decode_bytes("input.stdin", &d)?, false),
        (None, Some(d)) => (decode_bytes("input.pty", &d)?, true),
        _ => {
            return Err(ConnectError::invalid(
                "input: give exactly one of `stdin` and `pty`",
            ))
        }
    };
    match (&p.handle, to_pty) {
        (Attachable::Process(h), false) => h.send_stdin(data).await?,
        (Attachable::Terminal(t), true) => t.send(data).await?,
        (Attachable::Process(_), true) => {
            return Err(ConnectError::invalid(
                "the process has no pty; send `stdin`",
            ))
        }
        (Attachable::Terminal(_), false) => {
            return Err(ConnectError::invalid(
                "the process is a terminal; send `pty`",
            ))
        }
    }
    Ok(())
}

/// The longest keepalive interval taken from a client.
const MAX_KEEPALIVE: Duration = Duration::from_secs(300);

/// How a call's stream is paced and bounded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// The interval of keepalive events (`Keepalive-Ping-Interval`, seconds).
    pub(crate) keepalive: Duration,
    /// When the call ends (`Connect-Timeout-Ms` from its arrival).
    pub(crate) deadline: Option<std::time::Instant>,
}

/// What a client asks for: `Keepalive-Ping-Interval` (1-300 s) and
/// `Connect-Timeout-Ms` (0 or missing: no deadline).
pub(crate) fn timing(req: &HttpRequest) -> Timing {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let keepalive = header("keepalive-ping-interval")
        .filter(|s| *s >= 1)
        .map_or(DEFAULT_KEEPALIVE, |s| {
            Duration::from_secs(s).min(MAX_KEEPALIVE)
        });
    let deadline = header("connect-timeout-ms")
        .filter(|ms| *ms > 0)
        .and_then(|ms| std::time::Instant::now().checked_add(Duration::from_millis(ms)));
    Timing {
        keepalive,
        deadline,
    }
}

/// `Start`: starts a process (a terminal with `pty`) and streams its events.
pub(crate) async fn start(
    sbx: Arc<Sbx>,
    req: &HttpRequest,
    message: &[u8],
) -> Result<HttpResponse, ConnectError> {
    let r: StartRequest = connect::parse(message)?;
    let config = r
        .process
        .ok_or_else(|| ConnectError::invalid("give `process`: the command to run"))?;
    if config.cmd.is_empty() {
        return Err(ConnectError::invalid("process.cmd: name a program to run"));
    }
    if r.tag
        .as_deref()
        .is_some_and(|t| t.starts_with(RESERVED_TAG))
    {
        return Err(ConnectError::invalid(format!(
            "tag: tags starting with `{RESERVED_TAG}` are reserved; choose another"
        )));
    }
    let mut env = sbx.env.clone();
    env.extend(config.envs.clone());
    let cwd = config.cwd.as_deref().map(|c| sbx.path(c));
    // The session records it in its process table (the only one) in the actor's
    // turn, whether or not this caller stays for the answer.
    let started = match r.pty {
        Some(pty) => {
            let spec = TerminalSpec {
                command: config.cmd,
                args: config.args,
                size: TerminalSize {
                    rows: pty.size.rows,
                    cols: pty.size.cols,
                },
                env,
                cwd,
                tag: r.tag,
            };
            sbx.handle.open_terminal(spec).await?
        }
        None => {
            let spec = ProcessSpec {
                argv: std::iter::once(config.cmd).chain(config.args).collect(),
                env,
                cwd,
                // E2B's agent opens stdin unless told not to.
                stdin: r.stdin.unwrap_or(true),
                tag: r.tag,
            };
            sbx.handle.start_process(spec).await?
        }
    };
    Ok(stream_events(
        &sbx,
        pid_of(&started.info),
        &started.handle,
        timing(req),
    ))
}

/// `Connect`: streams the events of a running process from its oldest output
/// still held.
pub(crate) async fn connect_to(
    sbx: Arc<Sbx>,
    req: &HttpRequest,
    message: &[u8],
) -> Result<HttpResponse, ConnectError> {
    let r: SelectRequest = connect::parse(message)?;
    let p = find(&sbx, &selector(r.process)?).await?;
    Ok(stream_events(&sbx, pid_of(&p.info), &p.handle, timing(req)))
}

/// The event stream of a process: `start`, its output as `data`, then `end`, with
/// `keepalive` events while it is quiet.
fn stream_events(sbx: &Sbx, pid: u32, handle: &Attachable, timing: Timing) -> HttpResponse {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let pty = matches!(handle, Attachable::Terminal(_));
    let shared: Arc<ProcessShared> = handle.shared().clone();
    let reader = shared.output();
    let gone = sbx.gone.clone();
    // Cancelled only when the stream ends for the kill, not after a full stream.
    let dropped = tokio_util::sync::CancellationToken::new();
    let drop_it = dropped.clone();
    actix_web::rt::spawn(async move {
        let event = |e: Value| connect::envelope(0, &json!({ "event": e }));
        let deadline = timing.deadline.map(tokio::time::Instant::from_std);
        let expired = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let events = async {
            if tx
                .send(event(json!({ "start": { "pid": pid } })))
                .await
                .is_err()
            {
                return;
            }
            let mut reader = reader;
            let mut output_open = true;
            loop {
                // Output first; once it has ended, the exit; keepalives while quiet.
                let next = tokio::time::timeout(timing.keepalive, async {
                    if output_open {
                        match reader.next().await {
                            Some(c) => Some(Ok(c)),
                            None => Some(Err(None)),
                        }
                    } else {
                        Some(Err(Some(shared.wait().await)))
                    }
                })
                .await;
                let frame = match next {
                    Err(_) => event(json!({ "keepalive": {} })),
                    Ok(Some(Ok(chunk))) => {
                        let key = match chunk.stream {
                            _ if pty => "pty",
                            StreamKind::Stdout => "stdout",
                            StreamKind::Stderr => "stderr",
                        };
                        event(json!({ "data": { key: b64(&chunk.data) } }))
                    }
                    Ok(Some(Err(None))) | Ok(None) => {
                        output_open = false;
                        continue;
                    }
                    Ok(Some(Err(Some(exit)))) => {
                        let (code, status) = match exit.signal {
                            Some(sig) => (-1, format!("signal: {}", signal_name(sig))),
                            None => (exit.exit_code, format!("exit status {}", exit.exit_code)),
                        };
                        let _ = tx
                            .send(event(json!({
                                "end": { "exitCode": code, "exited": exit.signal.is_none(), "status": status }
                            })))
                            .await;
                        let _ = tx.send(connect::end_of_stream(None)).await;
                        return;
                    }
                };
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
        };
        // The stream ends when its events do, when the caller has gone (the process
        // goes on: only SendSignal kills it), or at the caller's deadline.
        // A killed sandbox's process streams end as E2B's agent's do when its
        // sandbox goes: the connection drops, with no `end` (the SDK then asks
        // whether the sandbox runs, and says it was killed). The kill is seen first:
        // it is marked before the sandbox's processes are.
        tokio::select! {
            biased;
            () = gone.cancelled() => drop_it.cancel(),
            () = events => {}
            () = tx.closed() => {}
            () = expired => {
                let _ = tx
                    .send(connect::end_of_stream(Some(&ConnectError::new(
                        Code::DeadlineExceeded,
                        "the call's Connect-Timeout-Ms passed; the process goes on (connect to it again)",
                    ))))
                    .await;
            }
        }
    });
    streaming_until(rx, dropped)
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        9 => "killed",
        15 => "terminated",
        2 => "interrupt",
        1 => "hangup",
        6 => "aborted",
        11 => "segmentation fault",
        13 => "broken pipe",
        _ => "signal",
    }
}

/// A Connect stream answer fed by `rx`.
pub(crate) fn streaming(rx: tokio::sync::mpsc::Receiver<Bytes>) -> HttpResponse {
    streaming_until(rx, tokio_util::sync::CancellationToken::new())
}

/// [`streaming`], whose connection drops (no end of the stream) when `rx` ends
/// after `gone` was cancelled: what a client of E2B sees when its sandbox goes.
fn streaming_until(
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    gone: tokio_util::sync::CancellationToken,
) -> HttpResponse {
    let body = futures_util::stream::unfold(Some(rx), move |rx| {
        let gone = gone.clone();
        async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(b) => Some((Ok::<_, actix_web::Error>(b), Some(rx))),
                None if gone.is_cancelled() => Some((
                    Err(actix_web::error::ErrorServiceUnavailable(
                        "the sandbox was killed",
                    )),
                    None,
                )),
                None => None,
            }
        }
    });
    HttpResponse::Ok()
        .content_type(connect::STREAM_JSON)
        .insert_header(("cache-control", "no-store"))
        .streaming(body)
}

/// `StreamInput`: a client stream of input for one process (a `start` naming it,
/// then `data` messages), answered once it ends.
pub(crate) async fn stream_input(
    sbx: Arc<Sbx>,
    mut payload: web::Payload,
) -> Result<HttpResponse, ConnectError> {
    let mut decoder = connect::Decoder::new(MAX_MESSAGE);
    let mut target: Option<Started> = None;
    let mut ended = false;
    while !ended {
        let Some(piece) = payload.next().await else {
            break;
        };
        let piece = piece.map_err(|e| ConnectError::invalid(format!("reading the stream: {e}")))?;
        decoder.push(&piece);
        while let Some((flag, msg)) = decoder.next()? {
            if flag & connect::END_STREAM != 0 {
                ended = true;
                break;
            }
            let v: Value = connect::parse(&msg)?;
            if let Some(start) = v.get("start") {
                let r: SelectRequest = serde_json::from_value(start.clone())
                    .map_err(|e| ConnectError::invalid(format!("start: {e}")))?;
                target = Some(find(&sbx, &selector(r.process)?).await?);
            } else if let Some(data) = v.get("data") {
                let p = target.as_ref().ok_or_else(|| {
                    ConnectError::invalid("send `start` naming the process before `data`")
                })?;
                let input: InputJson = data
                    .get("input")
                    .map(InputJson::deserialize)
                    .transpose()
                    .map_err(|e| ConnectError::invalid(format!("data.input: {e}")))?
                    .unwrap_or_default();
                write_input(p, input).await?;
            }
        }
    }
    if decoder.has_partial() {
        return Err(ConnectError::invalid("the stream ended inside an envelope"));
    }
    let mut out = connect::envelope(0, &json!({})).to_vec();
    out.extend_from_slice(&connect::end_of_stream(None));
    Ok(HttpResponse::Ok()
        .content_type(connect::STREAM_JSON)
        .body(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_name_one_process() {
        let s: SelectorJson = serde_json::from_str(r#"{"pid": 1001}"#).unwrap();
        assert_eq!(s.selector().unwrap(), Selector::Pid(1001));
        let s: SelectorJson = serde_json::from_str(r#"{"tag": "srv"}"#).unwrap();
        assert_eq!(s.selector().unwrap(), Selector::Tag("srv".into()));
        let s: SelectorJson = serde_json::from_str(r#"{}"#).unwrap();
        assert_eq!(s.selector().unwrap_err().code, Code::InvalidArgument);
    }

    #[test]
    fn bytes_decode_in_every_base64_form() {
        assert_eq!(decode_bytes("x", "aGk=").unwrap(), b"hi");
        assert_eq!(decode_bytes("x", "aGk").unwrap(), b"hi");
        assert_eq!(decode_bytes("x", "-_8").unwrap(), [0xfb, 0xff]);
        assert!(decode_bytes("x", "!!").is_err());
    }
}
