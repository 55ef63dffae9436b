//! The code interpreter (port 49999): `POST /execute` and the contexts of
//! `e2b-code-interpreter`.
//!
//! A context is a persistent interpreter: a background process of the sandbox's
//! session running Paddock's runner (`runners/python.py`), which keeps one namespace
//! for the context's life. `/execute` sends it the code on stdin and streams its
//! answers back as E2B's NDJSON lines (`stdout`, `stderr`, `result`, `error`,
//! `number_of_executions`, `end_of_execution`). One execution runs at a time in a
//! context; others wait for it. A context whose process died is started again on
//! its next execution, with a fresh namespace.

// The refusals here are whole answers (`HttpResponse`), made at most once per
// request; their size on the stack does not matter.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use paddock_core::interactive::OutputReader;
use paddock_core::ProcessSpec;
use paddock_pool::Attachable;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::files::http_error;
use crate::registry::Sbx;

/// The Python runner, passed to `python3 -c`.
const PYTHON_RUNNER: &str = include_str!("runners/python.py");
/// The JavaScript runner, passed to `node -e` by its host.
const NODE_RUNNER: &str = include_str!("runners/node.js");
/// The host of the JavaScript runner (the Python runner's protocol around node),
/// passed to `python3 -c`.
const NODE_HOST: &str = include_str!("runners/node_host.py");
/// Most contexts of one sandbox.
const MAX_CONTEXTS: usize = 16;
/// Most bytes of one answer line of a runner; a longer one is dropped.
const MAX_LINE: usize = 16 << 20;
/// Most executions waiting in one context.
const MAX_WAITING: usize = 8;
/// Most bytes of code in one execution.
const MAX_CODE: usize = 1 << 20;
/// How long an interrupted execution may take to end before its interpreter is
/// killed (and the context restarts).
const INTERRUPT_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
/// SIGINT: what interrupts an execution whose caller went away.
const SIGINT: i32 = 2;

/// The contexts of one sandbox.
#[derive(Default)]
pub(crate) struct Contexts {
    by_id: BTreeMap<String, Arc<Context>>,
    /// The context `/execute` uses without a `context_id`, by language.
    defaults: BTreeMap<&'static str, String>,
}

/// One persistent interpreter.
pub(crate) struct Context {
    id: String,
    language: &'static str,
    cwd: String,
    io: tokio::sync::Mutex<Option<Io>>,
    /// Its process, also reachable while an execution holds `io` (to kill it).
    process: parking_lot::Mutex<Option<paddock_core::ProcessHandle>>,
    /// Removed: an interpreter started for it after all is killed at once.
    removed: std::sync::atomic::AtomicBool,
    /// Executions waiting for the one that runs.
    waiting: std::sync::atomic::AtomicUsize,
}

/// A context's running process, and what was read of its answers.
struct Io {
    handle: paddock_core::ProcessHandle,
    reader: OutputReader,
    buf: Vec<u8>,
    next: u64,
}

impl Context {
    fn describe(&self) -> Value {
        json!({ "id": self.id, "language": self.language, "cwd": self.cwd })
    }

    /// Kills its interpreter; an execution in it ends with an error, and the next
    /// one starts a fresh interpreter.
    fn kill(&self) {
        if let Some(p) = self.process.lock().take() {
            let _ = p.kill();
        }
    }
}

fn language(name: Option<&str>) -> Result<&'static str, HttpResponse> {
    match name.map(|l| l.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("python") | Some("python3") => Ok("python"),
        Some("javascript") | Some("js") | Some("node") => Ok("javascript"),
        Some(other) => Err(http_error(
            StatusCode::BAD_REQUEST,
            format!("language {other:?} is not offered here; use python or javascript"),
        )),
    }
}

fn new_context(
    sbx: &Sbx,
    language: &'static str,
    cwd: Option<&str>,
) -> Result<Arc<Context>, HttpResponse> {
    let mut contexts = sbx.contexts.lock();
    if contexts.by_id.len() >= MAX_CONTEXTS {
        return Err(http_error(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{MAX_CONTEXTS} contexts are open in this sandbox; remove one first"),
        ));
    }
    let ctx = Arc::new(Context {
        id: uuid::Uuid::new_v4().to_string(),
        language,
        cwd: sbx.path(cwd.unwrap_or("")),
        io: tokio::sync::Mutex::new(None),
        process: parking_lot::Mutex::new(None),
        removed: Default::default(),
        waiting: Default::default(),
    });
    contexts.by_id.insert(ctx.id.clone(), ctx.clone());
    Ok(ctx)
}

/// Starts the context's interpreter and waits for it to say it is ready.
async fn start(sbx: &Sbx, ctx: &Context) -> Result<Io, String> {
    let spec = ProcessSpec {
        argv: match ctx.language {
            "javascript" => vec![
                "python3".into(),
                "-u".into(),
                "-c".into(),
                NODE_HOST.into(),
                NODE_RUNNER.into(),
            ],
            _ => vec![
                "python3".into(),
                "-u".into(),
                "-c".into(),
                PYTHON_RUNNER.into(),
            ],
        },
        env: sbx.env.clone(),
        cwd: Some(ctx.cwd.clone()),
        stdin: true,
        // Not a process of E2B's process service: its `List` leaves it out.
        tag: Some(format!("{}{}", crate::process::RESERVED_TAG, ctx.id)),
    };
    // An engine that failed for the moment (a container agent that did not answer
    // in time, which says to retry) gets one more try before the caller is told.
    let started = match sbx.handle.start_process(spec.clone()).await {
        Err(e) if e.code == paddock_core::ErrorCode::EngineFailed => {
            tracing::warn!(sandbox = %sbx.id, error = %e, "starting an interpreter failed; trying once more");
            sbx.handle.start_process(spec).await
        }
        other => other,
    }
    .map_err(|e| format!("{}: {}", e.code.as_str(), e.message))?;
    let Attachable::Process(handle) = started.handle else {
        return Err("the interpreter did not start as a process".into());
    };
    // An interpreter this one replaces (a restart raced with a start) goes.
    if let Some(old) = ctx.process.lock().replace(handle.clone()) {
        let _ = old.kill();
    }
    if ctx.removed.load(Ordering::Acquire) {
        let _ = handle.kill();
        return Err("the context was removed".into());
    }
    let mut io = Io {
        reader: handle.output(),
        handle,
        buf: Vec::new(),
        next: 0,
    };
    match io.line().await {
        Some(v) if v["type"] == "ready" => Ok(io),
        Some(v) => Err(format!("the interpreter did not start: {v}")),
        None => {
            let exit = io.handle.wait().await;
            Err(format!(
                "the interpreter exited with {} before it was ready",
                exit.exit_code
            ))
        }
    }
}

impl Io {
    /// The next answer line of the runner; `None` once its output ended (it died).
    async fn line(&mut self) -> Option<Value> {
        loop {
            if let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                match serde_json::from_slice::<Value>(&line) {
                    Ok(v) => return Some(v),
                    // Not an answer (the runner's own crash text): skipped.
                    Err(_) => continue,
                }
            }
            if self.buf.len() > MAX_LINE {
                self.buf.clear();
            }
            let chunk = self.reader.next().await?;
            if chunk.stream == paddock_core::StreamKind::Stdout {
                self.buf.extend_from_slice(&chunk.data);
            }
        }
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[derive(Debug, Default, Deserialize)]
struct ExecuteBody {
    #[serde(default)]
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
struct ContextBody {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

fn parse<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, HttpResponse> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| http_error(StatusCode::BAD_REQUEST, format!("malformed body: {e}")))
}

/// Every route of port 49999.
pub(crate) async fn route(sbx: Arc<Sbx>, req: &HttpRequest, body: web::Bytes) -> HttpResponse {
    let path = req.path();
    let method = req.method().as_str();
    match (method, path) {
        ("GET", "/health") => HttpResponse::Ok().json(json!({ "status": "ok" })),
        ("POST", "/execute") => execute(sbx, &body, paddock_pool::http::client_gone(req)).await,
        ("POST", "/contexts") => {
            let b: ContextBody = match parse(&body) {
                Ok(b) => b,
                Err(r) => return r,
            };
            let lang = match language(b.language.as_deref()) {
                Ok(l) => l,
                Err(r) => return r,
            };
            match new_context(&sbx, lang, b.cwd.as_deref()) {
                Ok(ctx) => HttpResponse::Ok().json(ctx.describe()),
                Err(r) => r,
            }
        }
        ("GET", "/contexts") => {
            let list: Vec<Value> = sbx
                .contexts
                .lock()
                .by_id
                .values()
                .map(|c| c.describe())
                .collect();
            HttpResponse::Ok().json(list)
        }
        _ => {
            let Some(rest) = path.strip_prefix("/contexts/") else {
                return http_error(
                    StatusCode::NOT_FOUND,
                    format!("{method} {path} is not a route of the code interpreter"),
                );
            };
            let (id, action) = rest.split_once('/').unwrap_or((rest, ""));
            let ctx = sbx.contexts.lock().by_id.get(id).cloned();
            let Some(ctx) = ctx else {
                return http_error(StatusCode::NOT_FOUND, format!("context {id} not found"));
            };
            match (method, action) {
                ("DELETE", "") => {
                    ctx.removed.store(true, Ordering::Release);
                    {
                        let mut contexts = sbx.contexts.lock();
                        contexts.by_id.remove(id);
                        contexts.defaults.retain(|_, d| d != id);
                    }
                    ctx.kill();
                    HttpResponse::NoContent().finish()
                }
                ("POST", "restart") => {
                    // Answered once the old interpreter is gone: the next execution
                    // starts a fresh one.
                    let process = ctx.process.lock().take();
                    if let Some(p) = process {
                        let _ = p.kill();
                        p.wait().await;
                    }
                    *ctx.io.lock().await = None;
                    // One started while this waited goes too.
                    ctx.kill();
                    HttpResponse::NoContent().finish()
                }
                _ => http_error(
                    StatusCode::NOT_FOUND,
                    format!("{method} {path} is not a route of the code interpreter"),
                ),
            }
        }
    }
}

/// Kills every context's interpreter of a sandbox being ended.
pub(crate) fn forget_all(sbx: &Sbx) {
    let contexts = std::mem::take(&mut sbx.contexts.lock().by_id);
    for ctx in contexts.values() {
        ctx.kill();
    }
}

/// The context an execution runs in: the one named, or the language's default
/// (made on first use).
fn context_for(sbx: &Sbx, b: &ExecuteBody) -> Result<Arc<Context>, HttpResponse> {
    if let Some(id) = &b.context_id {
        return sbx
            .contexts
            .lock()
            .by_id
            .get(id)
            .cloned()
            .ok_or_else(|| http_error(StatusCode::NOT_FOUND, format!("context {id} not found")));
    }
    let lang = language(b.language.as_deref())?;
    let existing = {
        let contexts = sbx.contexts.lock();
        contexts
            .defaults
            .get(lang)
            .and_then(|id| contexts.by_id.get(id).cloned())
    };
    if let Some(c) = existing {
        return Ok(c);
    }
    let c = new_context(sbx, lang, None)?;
    sbx.contexts.lock().defaults.insert(lang, c.id.clone());
    Ok(c)
}

/// `v` as one NDJSON line (without its newline): JSON with the characters some
/// readers take for line ends (U+0085, U+2028, U+2029; Python's `str.splitlines`,
/// which httpx's `iter_lines` follows) escaped, so that output holding them does not
/// split a line.
fn ndjson_line(v: &Value) -> Vec<u8> {
    let text = v.to_string();
    if !text.contains(['\u{85}', '\u{2028}', '\u{2029}']) {
        return text.into_bytes();
    }
    text.replace('\u{85}', "\\u0085")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
        .into_bytes()
}

fn context_error(name: &str, value: String) -> Value {
    json!({ "type": "error", "name": name, "value": value, "traceback": "" })
}

/// `gone` resolves when the caller's connection has closed (see
/// [`paddock_pool::http::client_gone`]).
async fn execute(
    sbx: Arc<Sbx>,
    body: &[u8],
    gone: Option<impl std::future::Future<Output = ()> + Send + 'static>,
) -> HttpResponse {
    let b: ExecuteBody = match parse(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if b.code.len() > MAX_CODE {
        return http_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the code has {} bytes; at most {MAX_CODE}", b.code.len()),
        );
    }
    let ctx = match context_for(&sbx, &b) {
        Ok(c) => c,
        Err(r) => return r,
    };
    // The policy stage sees the code as it would an execution's: a refusal is the
    // execution's error (named by its stable code), before the code reaches the
    // interpreter.
    let program = paddock_core::Program::code(
        if ctx.language == "javascript" {
            paddock_core::Language::Javascript
        } else {
            paddock_core::Language::Python
        },
        b.code.as_str(),
    );
    if let Err(e) = sbx.handle.check_program(program).await {
        if e.code == paddock_core::ErrorCode::NotFound {
            return http_error(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox {} was not found", sbx.id),
            );
        }
        let mut lines = Vec::new();
        for v in [
            json!({ "type": "error", "name": e.code.as_str(), "value": e.message, "traceback": "" }),
            json!({ "type": "end_of_execution" }),
        ] {
            lines.extend_from_slice(v.to_string().as_bytes());
            lines.push(b'\n');
        }
        return HttpResponse::Ok()
            .content_type("application/x-ndjson")
            .body(lines);
    }
    if ctx.waiting.load(Ordering::Acquire) >= MAX_WAITING {
        return http_error(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{MAX_WAITING} executions wait in this context already; retry when one has run"
            ),
        );
    }
    ctx.waiting.fetch_add(1, Ordering::AcqRel);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(32);
    let code = b.code;
    let env = b.env_vars.unwrap_or_default();
    actix_web::rt::spawn(async move {
        let send = |v: Value| {
            let tx = tx.clone();
            async move {
                let mut line = ndjson_line(&v);
                line.push(b'\n');
                // A caller that went away stops getting lines; the turn still ends,
                // so that the context is left between turns.
                let _ = tx.send(Bytes::from(line)).await;
            }
        };
        // The caller left: its connection closed, or its answer was dropped. (A
        // write would show it too, but code may stay silent for long.)
        let answer = tx.clone();
        let mut left = Box::pin(async move {
            let gone = async {
                match gone {
                    Some(g) => g.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = answer.closed() => {}
                () = gone => {}
            }
        });
        // A caller that goes away while its execution waits takes it back.
        let waited = tokio::select! {
            g = ctx.io.lock() => Some(g),
            () = &mut left => None,
        };
        ctx.waiting.fetch_sub(1, Ordering::AcqRel);
        let Some(mut guard) = waited else {
            return;
        };
        if guard.is_none() {
            match start(&sbx, &ctx).await {
                Ok(io) => *guard = Some(io),
                Err(why) => {
                    send(context_error("ContextError", why)).await;
                    return;
                }
            }
        }
        let Some(io) = guard.as_mut() else {
            return;
        };
        io.next += 1;
        let n = io.next;
        let mut request = json!({ "code": code, "env": env, "n": n }).to_string();
        request.push('\n');
        if let Err(e) = io.handle.write_stdin(request.as_bytes()).await {
            *guard = None;
            send(context_error(
                "ContextError",
                format!(
                    "the interpreter is gone ({}); run again for a fresh one",
                    e.message
                ),
            ))
            .await;
            return;
        }
        // A caller that goes away while its code runs (the SDK's own `timeout` ran
        // out, or it was stopped) interrupts it, as a notebook's interrupt does:
        // Python sees a KeyboardInterrupt and the context lives on. Code that does
        // not end within INTERRUPT_GRACE after that loses its interpreter.
        let mut interrupted: Option<tokio::time::Instant> = None;
        let interrupt = |io: &Io| {
            tracing::debug!(sandbox = %sbx.id, context = %ctx.id, "the caller left; interrupting its execution");
            let _ = io.handle.signal(SIGINT);
            Some(tokio::time::Instant::now() + INTERRUPT_GRACE)
        };
        loop {
            enum Next {
                Line(Option<Value>),
                CallerLeft,
                Overdue,
            }
            // Checked first on every round too, so that code that keeps its answer
            // busy with output is interrupted (and killed) on time as well.
            if interrupted.is_none() && futures_util::FutureExt::now_or_never(&mut left).is_some() {
                interrupted = interrupt(io);
            }
            if interrupted.is_some_and(|at| tokio::time::Instant::now() >= at) {
                let _ = io.handle.kill();
                ctx.process.lock().take();
                *guard = None;
                return;
            }
            let overdue = async {
                match interrupted {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                // An answer that is there is taken first: an `end` already read
                // is not interrupted.
                biased;
                v = io.line() => Next::Line(v),
                () = &mut left, if interrupted.is_none() => Next::CallerLeft,
                () = overdue => Next::Overdue,
            };
            let v = match next {
                Next::Line(v) => v,
                Next::CallerLeft => {
                    interrupted = interrupt(io);
                    continue;
                }
                Next::Overdue => {
                    let _ = io.handle.kill();
                    ctx.process.lock().take();
                    *guard = None;
                    return;
                }
            };
            let Some(v) = v else {
                // The interpreter died (killed, restarted, out of memory): its state
                // is lost, and the next execution starts a fresh one.
                *guard = None;
                send(context_error(
                    "ContextRestarting",
                    "the interpreter ended during the execution; its state is lost and the next execution starts a fresh one".into(),
                ))
                .await;
                send(json!({ "type": "unexpected_end_of_execution" })).await;
                return;
            };
            match v["type"].as_str() {
                Some("out") => {
                    let stream = if v["stream"] == "stderr" {
                        "stderr"
                    } else {
                        "stdout"
                    };
                    send(json!({ "type": stream, "text": v["text"], "timestamp": now_us() })).await;
                }
                Some("result") | Some("error") => send(v).await,
                Some("end") if v["n"] == json!(n) => {
                    send(json!({
                        "type": "number_of_executions",
                        "execution_count": v["count"],
                    }))
                    .await;
                    send(json!({ "type": "end_of_execution" })).await;
                    // JavaScript's host ends on an interrupt (node with it): a
                    // context interrupted after all starts afresh.
                    if interrupted.is_some() && ctx.language == "javascript" {
                        let _ = io.handle.kill();
                        ctx.process.lock().take();
                        *guard = None;
                    }
                    return;
                }
                _ => {}
            }
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, actix_web::Error>(b), rx))
    });
    HttpResponse::Ok()
        .content_type("application/x-ndjson")
        .streaming(body)
}
