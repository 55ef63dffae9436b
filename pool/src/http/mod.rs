//! The HTTP API (`paddock serve`): JSON over actix-web, on top of the [`Paddock`]
//! handle. See `docs/http-api.md` for every route.
//!
//! [`start`] runs the server on its own thread (its own actix system) and returns the
//! bound address; [`HttpServerHandle::stop`] stops it gracefully.

mod errors;
mod interactive;
mod openapi;
mod results;
mod tenancy;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use bytes::Bytes;
use paddock_core::api::{ExecBody, SandboxBody};
use paddock_core::{
    EngineKind, Error, ErrorCode, ExecutionId, MetricsAccess, SandboxSpec, ServerConfig,
};
use serde::Deserialize;

pub use errors::{status_for, ApiError};

/// Every route the server answers, as `(method, path pattern)` (`{id}`, `{path}`,
/// `{process}` and `{port}` stand for path parameters): the table
/// `/v1/openapi.json` is made from, so tests can walk every route, including ones
/// added later.
pub fn route_table() -> impl Iterator<Item = (&'static str, &'static str)> {
    openapi::ROUTES.iter().map(|(m, p, _, _)| (*m, *p))
}
use results::{Answer, Begin, Bounds, ResultStore};
use tenancy::{account, caller, Gauge};

use crate::audit::AuditQuery;
use crate::{Caller, Execute, Paddock, StreamEvent};

/// Shared by every worker.
#[derive(Debug)]
struct State {
    paddock: Paddock,
    config: ServerConfig,
    results: ResultStore,
    draining: AtomicBool,
    /// Requests in progress per tenant (streamed responses until they end).
    requests: Arc<Gauge>,
    /// Open WebSockets per tenant.
    websockets: Arc<Gauge>,
    /// Where `/metrics` is served.
    metrics: MetricsAccess,
}

impl State {
    fn new(paddock: Paddock, config: ServerConfig) -> Result<State, Error> {
        let metrics = config.metrics_access()?;
        Ok(State {
            results: ResultStore::new(Bounds {
                retention: Duration::from_secs(config.result_retention_s),
                max: config.max_results,
                max_bytes: config.max_result_bytes,
                max_bytes_per_tenant: config.max_result_bytes_per_tenant,
            }),
            requests: Gauge::new(
                config.max_requests_per_tenant,
                "requests in progress",
                "server.max_requests_per_tenant",
            ),
            websockets: Gauge::new(
                config.max_websockets_per_tenant,
                "WebSockets open",
                "server.max_websockets_per_tenant",
            ),
            metrics,
            paddock,
            config,
            draining: AtomicBool::new(false),
        })
    }
}

/// A running server.
#[derive(Debug)]
pub struct HttpServerHandle {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    state: Arc<State>,
    server: actix_web::dev::ServerHandle,
    metrics_server: Option<actix_web::dev::ServerHandle>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServerHandle {
    /// The address the server is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address `/metrics` is served on when `server.metrics` gives it one of its
    /// own.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Stops admitting work: new executions get 503 and `/readyz` fails.
    pub fn begin_drain(&self) {
        self.state.draining.store(true, Ordering::Release);
    }

    /// Stops the server (after in-flight requests finish) and joins its thread.
    pub async fn stop(mut self) {
        self.begin_drain();
        if let Some(m) = self.metrics_server.take() {
            m.stop(true).await;
        }
        self.server.stop(true).await;
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// Starts the HTTP server for `paddock` with `config`.
///
/// `paddock` must have been built with the access rules `config` implies (the same
/// `[server]` section in its config, or `.access(config.access_rules())`): a server
/// with API keys refuses level `none` and `unrestricted` network unless allowed, and
/// it refuses to start on a handle that would let them through.
pub fn start(paddock: Paddock, config: ServerConfig) -> Result<HttpServerHandle, Error> {
    config.validate()?;
    if *paddock.access_rules() != config.access_rules() {
        return Err(Error::invalid_config(
            "server",
            "the Paddock handle enforces other allowed levels or networks than this server \
             config implies (API keys, allowed_levels, allowed_networks); build it with \
             `.config(…)` holding the same [server] section, or with \
             `.access(server.access_rules())`",
        ));
    }
    let listen: SocketAddr = config
        .listen
        .parse()
        .map_err(|e| Error::invalid_config("server.listen", e))?;
    let state = Arc::new(State::new(paddock, config)?);
    let app_state = state.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("paddock-http".into())
        .spawn(move || {
            let system = actix_rt::System::new();
            system.block_on(async move {
                let workers = app_state.config.workers;
                let metrics = app_state.metrics.clone();
                let data = web::Data::from(app_state);
                let metrics_data = data.clone();
                let server = HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .wrap(actix_web::middleware::from_fn(tenancy::limit_requests))
                        .configure(routes)
                })
                .workers(workers)
                .disable_signals()
                .shutdown_timeout(30)
                .bind(listen);
                let server = match server {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(Error::invalid_config(
                            "server.listen",
                            format!("cannot listen on {listen}: {e}"),
                        )));
                        return;
                    }
                };
                let addr = server.addrs().first().copied().unwrap_or(listen);
                // `/metrics` on an address of its own, when configured so.
                let mut metrics_server = None;
                if let MetricsAccess::Listen(at) = metrics {
                    let bound = HttpServer::new(move || {
                        App::new()
                            .app_data(metrics_data.clone())
                            .route("/metrics", web::get().to(metrics_only))
                    })
                    .workers(1)
                    .disable_signals()
                    .bind(at);
                    match bound {
                        Ok(m) => {
                            let m_addr = m.addrs().first().copied().unwrap_or(at);
                            let running = m.run();
                            metrics_server = Some((m_addr, running.handle()));
                            actix_rt::spawn(running);
                        }
                        Err(e) => {
                            let _ = tx.send(Err(Error::invalid_config(
                                "server.metrics",
                                format!("cannot listen on {at}: {e}"),
                            )));
                            return;
                        }
                    }
                }
                let running = server.run();
                let _ = tx.send(Ok((addr, running.handle(), metrics_server)));
                let _ = running.await;
            });
        })
        .map_err(|e| Error::engine_io("starting the HTTP thread", e))?;
    let (addr, server, metrics_server) = rx
        .recv()
        .map_err(|_| Error::new(ErrorCode::EngineFailed, "the HTTP thread failed to start"))??;
    let (metrics_addr, metrics_server) = match metrics_server {
        Some((a, h)) => (Some(a), Some(h)),
        None => (None, None),
    };
    Ok(HttpServerHandle {
        addr,
        metrics_addr,
        state,
        server,
        metrics_server,
        thread: Some(thread),
    })
}

/// Registers every route. `openapi::ROUTES` lists the same routes; a test checks
/// that every one of them is served.
fn routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::QueryConfig::default().error_handler(|err, _req| {
        ApiError::from(Error::invalid_options("query", err.to_string())).into()
    }))
    .app_data(web::PathConfig::default().error_handler(|err, _req| {
        ApiError::from(Error::invalid_options("path", err.to_string())).into()
    }))
    .default_service(web::to(|req: HttpRequest| async move {
        // A known path asked with a method it does not take is 405, with the
        // methods it does take.
        let allowed = openapi::methods_for(req.path());
        if !allowed.is_empty() {
            let allow = allowed.join(", ");
            return Err::<HttpResponse, ApiError>(
                ApiError::with_status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    ErrorCode::InvalidOptions,
                    format!(
                        "{} {} is not served; this path takes {allow}",
                        req.method(),
                        req.path()
                    ),
                )
                .with_allow(allow),
            );
        }
        Err::<HttpResponse, ApiError>(ApiError::from(Error::new(
            ErrorCode::NotFound,
            "no such route; see docs/http-api.md",
        )))
    }))
    .route("/healthz", web::get().to(healthz))
    .route("/v1/openapi.json", web::get().to(openapi_json))
    .route("/readyz", web::get().to(readyz))
    .route("/metrics", web::get().to(metrics))
    .route("/v1/stats", web::get().to(stats))
    .route("/v1/audit", web::get().to(audit))
    .route("/v1/audit/operator", web::get().to(operator_accesses))
    .route("/v1/executions", web::post().to(create_execution))
    .route("/v1/executions/{id}", web::get().to(get_execution))
    .route("/v1/executions/{id}", web::delete().to(cancel_execution))
    .route("/v1/sandboxes", web::post().to(create_sandbox))
    .route("/v1/sandboxes/{id}", web::get().to(sandbox_status))
    .route("/v1/sandboxes/{id}", web::delete().to(destroy_sandbox))
    .route("/v1/sandboxes/{id}/exec", web::post().to(sandbox_exec))
    .route("/v1/sandboxes/{id}/pause", web::post().to(pause_sandbox))
    .route(
        "/v1/sandboxes/{id}/unpause",
        web::post().to(unpause_sandbox),
    )
    .route("/v1/sandboxes/{id}/files", web::get().to(list_files))
    .route(
        "/v1/sandboxes/{id}/files/{path:.*}",
        web::get().to(read_file),
    )
    .route(
        "/v1/sandboxes/{id}/files/{path:.*}",
        web::put().to(write_file),
    )
    .route(
        "/v1/sandboxes/{id}/processes",
        web::post().to(interactive::start_process),
    )
    .route(
        "/v1/sandboxes/{id}/processes",
        web::get().to(interactive::list_processes),
    )
    .route(
        "/v1/sandboxes/{id}/processes/{process}",
        web::get().to(interactive::get_process),
    )
    .route(
        "/v1/sandboxes/{id}/processes/{process}/signal",
        web::post().to(interactive::signal_process),
    )
    .route(
        "/v1/sandboxes/{id}/processes/{process}/attach",
        web::get().to(interactive::attach),
    )
    .route(
        "/v1/sandboxes/{id}/terminals",
        web::post().to(interactive::open_terminal),
    )
    .route(
        "/v1/sandboxes/{id}/tcp/{port}",
        web::get().to(interactive::tcp),
    );
}

type Shared = web::Data<State>;

/// The caller's handle on `sandbox`, through the facade: a sandbox opened for one
/// tenant is `NOT_FOUND` to every other, so ids of other tenants' sandboxes neither
/// work nor show that they exist; a destroyed one of the caller's is 409
/// `ENGINE_DISPOSED`. `action` names what the caller does, for the record of an
/// operator's uses.
async fn sandbox_access(
    state: &State,
    req: &HttpRequest,
    sandbox: &str,
    action: &'static str,
) -> Result<crate::SandboxHandle, ApiError> {
    let caller = caller(&state.config, req)?;
    Ok(state.paddock.sandbox_for(&caller, sandbox, action).await?)
}

fn admitting(state: &State) -> Result<(), ApiError> {
    if state.draining.load(Ordering::Acquire) {
        return Err(ApiError::with_status(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::EngineDisposed,
            "the server is shutting down; retry on another instance",
        ));
    }
    Ok(())
}

/// An error from Paddock. While the server drains, Paddock refuses new work with
/// `ENGINE_DISPOSED` (it is shutting down): a request admitted just before the drain
/// began gets the same 503 as those after it, not the 409 of a destroyed sandbox.
fn refusal(state: &State, error: Error) -> ApiError {
    if error.code == ErrorCode::EngineDisposed && state.draining.load(Ordering::Acquire) {
        return ApiError {
            error,
            status: Some(StatusCode::SERVICE_UNAVAILABLE),
            allow: None,
        };
    }
    ApiError::from(error)
}

#[derive(Debug, Deserialize)]
struct StreamQuery {
    #[serde(default)]
    stream: bool,
}

/// Reads a body up to `limit` bytes (413 beyond it).
async fn read_body(
    mut payload: web::Payload,
    limit: usize,
    what: &str,
) -> Result<Vec<u8>, ApiError> {
    use futures_util::StreamExt;
    let mut data = Vec::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| Error::invalid_options("body", e.to_string()))?;
        if data.len() + chunk.len() > limit {
            return Err(ApiError::with_status(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::InvalidOptions,
                format!("the {what} exceeds {limit} bytes"),
            ));
        }
        data.extend_from_slice(&chunk);
    }
    Ok(data)
}

async fn parse_body<T: serde::de::DeserializeOwned>(
    state: &State,
    payload: web::Payload,
) -> Result<T, ApiError> {
    let body = read_body(
        payload,
        state.config.max_body_bytes,
        "request body (server.max_body_bytes)",
    )
    .await?;
    Ok(paddock_core::api::parse_body(&body)?)
}

fn answer_json(state: &State, answer: &Answer) -> HttpResponse {
    match answer.as_ref() {
        Ok(r) => HttpResponse::Ok().json(r.to_wire_json()),
        Err(e) => {
            let err = refusal(state, e.clone());
            actix_web::ResponseError::error_response(&err)
        }
    }
}

async fn create_execution(
    state: Shared,
    req: HttpRequest,
    query: web::Query<StreamQuery>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    admitting(&state)?;
    let caller = caller(&state.config, &req)?;
    let tenant = account(&caller);
    let body: ExecBody = parse_body(&state, payload).await?;
    let (request, engine, network, level) = body.into_request(tenant.clone());
    let mut msg = Execute::new(request);
    msg.engine = engine;
    msg.network = network;
    msg.level = level;
    msg.traceparent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let id = msg.request.id.clone();
    match state.results.begin(&id, tenant.as_deref(), key.as_deref()) {
        Begin::Attach(mut rx) => {
            let answer = loop {
                if let Some(a) = rx.borrow().clone() {
                    break a;
                }
                if rx.changed().await.is_err() {
                    return Err(
                        Error::new(ErrorCode::NotFound, "the original execution is gone").into(),
                    );
                }
            };
            Ok(answer_json(&state, &answer))
        }
        Begin::Run(tx) => {
            if query.stream {
                match state.paddock.execute_stream(msg).await {
                    Ok(stream) => Ok(stream_response(state.into_inner(), stream, id, Some(tx))),
                    Err(e) => {
                        // Refused before it ran: nothing to replay for the key.
                        state
                            .results
                            .finish_and_forget(&id, tx, Arc::new(Err(e.clone())));
                        Err(refusal(&state, e))
                    }
                }
            } else {
                // Driven by a task of its own, so that its answer is recorded (for
                // lookups by id and the idempotency key) even when the caller hangs
                // up before it comes.
                let (done, answered) = tokio::sync::oneshot::channel();
                let shared = state.clone().into_inner();
                actix_rt::spawn(async move {
                    let answer = Arc::new(shared.paddock.execute_with(msg).await);
                    record(&shared, &id, tx, answer.clone());
                    let _ = done.send(answer);
                });
                let answer = answered.await.map_err(|_| {
                    Error::new(
                        ErrorCode::EngineFailed,
                        "the execution's task ended without an answer; look it up by id",
                    )
                })?;
                Ok(answer_json(&state, &answer))
            }
        }
    }
}

/// Records a finished execution's answer; a refusal worth retrying is not kept.
fn record(
    state: &State,
    id: &ExecutionId,
    tx: tokio::sync::watch::Sender<Option<Answer>>,
    answer: Answer,
) {
    if answer.as_ref().as_ref().is_err_and(retryable) {
        state.results.finish_and_forget(id, tx, answer);
    } else {
        state.results.finish(id, tx, answer);
    }
}

/// A refusal a client should retry (after `Retry-After`): never replayed for an
/// idempotency key.
fn retryable(e: &Error) -> bool {
    matches!(
        e.code,
        ErrorCode::RateLimited | ErrorCode::PoolExhausted | ErrorCode::EngineDisposed
    )
}

/// NDJSON: `started`, then `stdout`/`stderr` chunks as produced, then `result` (or
/// `error` when the execution was refused).
///
/// The execution is driven by a task of its own, not by the response body, so that
/// its answer is recorded (for `GET /v1/executions/{id}` and the idempotency key)
/// even when the caller hangs up mid-stream.
fn stream_response(
    state: Arc<State>,
    mut stream: crate::ExecutionStream,
    id: ExecutionId,
    mut tx: Option<tokio::sync::watch::Sender<Option<Answer>>>,
) -> HttpResponse {
    use futures_util::StreamExt;
    let started = ndjson(&serde_json::json!({"type": "started", "id": id}));
    let (lines_tx, lines_rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    actix_rt::spawn(async move {
        let mut reader_gone = false;
        while let Some(event) = stream.next().await {
            let line = match event {
                StreamEvent::Output(chunk) => {
                    let kind = match chunk.stream {
                        paddock_core::StreamKind::Stdout => "stdout",
                        paddock_core::StreamKind::Stderr => "stderr",
                    };
                    ndjson(&serde_json::json!({
                        "type": kind,
                        "data": String::from_utf8_lossy(&chunk.data),
                    }))
                }
                StreamEvent::Finished(result) => {
                    let answer: Answer = Arc::new(*result);
                    let line = match answer.as_ref() {
                        Ok(r) => {
                            let mut v = r.to_wire_json();
                            if let Some(o) = v.as_object_mut() {
                                o.insert("type".into(), "result".into());
                            }
                            ndjson(&v)
                        }
                        Err(e) => ndjson(&serde_json::json!({"type": "error", "error": e})),
                    };
                    if let Some(tx) = tx.take() {
                        record(&state, &id, tx, answer);
                    }
                    line
                }
            };
            // A caller that went away stops reading; the output is still drained so
            // the result above is reached.
            if !reader_gone && lines_tx.send(line).await.is_err() {
                reader_gone = true;
            }
        }
    });
    let rest = futures_util::stream::unfold(lines_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|line| (Ok::<Bytes, actix_web::Error>(line), rx))
    });
    let body = futures_util::stream::once(async move { Ok::<Bytes, actix_web::Error>(started) })
        .chain(rest);
    HttpResponse::Ok()
        .content_type("application/x-ndjson")
        .streaming(body.boxed_local())
}

fn ndjson(v: &serde_json::Value) -> Bytes {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn parse_id(raw: &str) -> Result<ExecutionId, ApiError> {
    Ok(ExecutionId::parse(raw)?)
}

async fn get_execution(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let caller = caller(&state.config, &req)?;
    let id = parse_id(&path)?;
    // Another tenant's execution is answered exactly like one that never existed.
    let found = state
        .results
        .get(&id)
        .filter(|(owner, _)| state.paddock.may_see(&caller, owner.as_deref(), &id));
    match found {
        Some((_, Some(answer))) => Ok(answer_json(&state, &answer)),
        Some((_, None)) => {
            Ok(HttpResponse::Ok().json(serde_json::json!({"id": id, "status": "running"})))
        }
        None => Err(Error::new(
            ErrorCode::NotFound,
            format!(
                "no execution {id} is running or kept (results are kept for {} s)",
                state.config.result_retention_s
            ),
        )
        .into()),
    }
}

async fn cancel_execution(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let caller = caller(&state.config, &req)?;
    let id = parse_id(&path)?;
    let cancelled = state.paddock.cancel(&caller, &id);
    let known = cancelled
        || state
            .results
            .get(&id)
            .is_some_and(|(owner, _)| caller.sees(owner.as_deref()));
    if !known {
        return Err(
            Error::new(ErrorCode::NotFound, format!("no execution {id} is running")).into(),
        );
    }
    Ok(HttpResponse::Ok().json(serde_json::json!({"id": id, "cancelled": cancelled})))
}

async fn create_sandbox(
    state: Shared,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    admitting(&state)?;
    let tenant = account(&caller(&state.config, &req)?);
    let body = read_body(
        payload,
        state.config.max_body_bytes,
        "request body (server.max_body_bytes)",
    )
    .await?;
    let body: SandboxBody = if body.iter().all(u8::is_ascii_whitespace) {
        SandboxBody::default()
    } else {
        paddock_core::api::parse_body(&body)?
    };
    let spec = SandboxSpec {
        level: body.level,
        network: body.network,
        limits: body.limits,
        tenant,
    };
    let handle = state
        .paddock
        .open_sandbox(spec, body.engine)
        .await
        .map_err(|e| refusal(&state, e))?;
    Ok(HttpResponse::Created().json(handle.info()))
}

async fn sandbox_status(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let status = match sandbox_access(&state, &req, &path, "sandbox.status").await {
        Ok(handle) => handle.status().await?,
        // A destroyed sandbox of the caller's answers its status.
        Err(e) if e.error.code == ErrorCode::EngineDisposed => {
            paddock_core::SandboxStatus::Destroyed
        }
        Err(e) => return Err(e),
    };
    Ok(HttpResponse::Ok().json(serde_json::json!({"status": status})))
}

async fn destroy_sandbox(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    match sandbox_access(&state, &req, &path, "sandbox.destroy").await {
        Ok(handle) => handle.destroy().await?,
        // Destroying a destroyed sandbox succeeds (idempotent).
        Err(e) if e.error.code == ErrorCode::EngineDisposed => {}
        Err(e) => return Err(e),
    }
    Ok(HttpResponse::NoContent().finish())
}

async fn pause_sandbox(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let handle = sandbox_access(&state, &req, &path, "sandbox.pause").await?;
    handle.pause().await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"status": "paused"})))
}

async fn unpause_sandbox(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let handle = sandbox_access(&state, &req, &path, "sandbox.unpause").await?;
    handle.unpause().await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"status": "ready"})))
}

async fn sandbox_exec(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<StreamQuery>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    admitting(&state)?;
    let handle = sandbox_access(&state, &req, &path, "sandbox.exec").await?;
    let body: ExecBody = parse_body(&state, payload).await?;
    // Accounted to the sandbox's tenant.
    let (request, _, _, _) = body.into_request(None);
    if query.stream {
        let id = request.id.clone();
        let stream = handle.exec_stream(request).await?;
        return Ok(stream_response(state.into_inner(), stream, id, None));
    }
    let r = handle.exec(request).await.map_err(|e| refusal(&state, e))?;
    Ok(HttpResponse::Ok().json(r.to_wire_json()))
}

#[derive(Debug, Deserialize)]
struct DirQuery {
    #[serde(default)]
    dir: String,
}

async fn list_files(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
    q: web::Query<DirQuery>,
) -> Result<HttpResponse, ApiError> {
    let handle = sandbox_access(&state, &req, &path, "sandbox.files.list").await?;
    let files = handle.list_files(&q.dir).await?;
    let out: Vec<_> = files
        .iter()
        .map(|f| serde_json::json!({"path": f.path, "size": f.size, "is_dir": f.is_dir}))
        .collect();
    Ok(HttpResponse::Ok().json(out))
}

/// Streams a file out through one bounded buffer, with its size as Content-Length.
async fn read_file(
    state: Shared,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (sandbox, file) = path.into_inner();
    let handle = sandbox_access(&state, &req, &sandbox, "sandbox.files.read").await?;
    let reader = handle.open_read(&file).await?;
    let body = tokio_util::io::ReaderStream::with_capacity(reader.reader, FILE_CHUNK_BYTES);
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .no_chunking(reader.size)
        .streaming(body))
}

/// The buffer a file moves through over HTTP, in each direction.
const FILE_CHUNK_BYTES: usize = 64 << 10;

/// Streams an upload into the file: the body goes through a bounded channel (a few
/// chunks) to the scheduler's thread, which writes it through one buffer; at most
/// `server.max_file_bytes` are taken (413 beyond, and no file is left).
async fn write_file(
    state: Shared,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    use futures_util::StreamExt;
    admitting(&state)?;
    let (sandbox, file) = path.into_inner();
    let handle = sandbox_access(&state, &req, &sandbox, "sandbox.files.write").await?;
    let max = state.config.max_file_bytes as u64;
    let too_large = || {
        ApiError::with_status(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::InvalidOptions,
            format!("the upload (server.max_file_bytes) exceeds {max} bytes"),
        )
    };
    let announced = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    let chunks =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    let source: paddock_core::ByteSource = Box::pin(tokio_util::io::StreamReader::new(chunks));
    let write = handle.write_from(&file, source, max);
    let pump = async move {
        let mut payload = payload;
        while let Some(chunk) = payload.next().await {
            let item = chunk.map_err(|e| std::io::Error::other(e.to_string()));
            let failed = item.is_err();
            // The writer stopped reading (done or refused): stop feeding it.
            if tx.send(item).await.is_err() || failed {
                break;
            }
        }
    };
    let (written, ()) = futures_util::join!(write, pump);
    match written {
        Ok(_) => Ok(HttpResponse::NoContent().finish()),
        // The upload's own bound (a file-size limit of the sandbox is its own answer).
        Err(e) if e.code == ErrorCode::LimitsExceeded && e.message.contains("(max_bytes)") => {
            Err(too_large())
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditParams {
    success: Option<bool>,
    tenant: Option<String>,
    engine: Option<EngineKind>,
    after: Option<String>,
    before: Option<String>,
    limit: Option<usize>,
}

async fn audit(
    state: Shared,
    req: HttpRequest,
    q: web::Query<AuditParams>,
) -> Result<HttpResponse, ApiError> {
    let caller = caller(&state.config, &req)?;
    let q = q.into_inner();
    let parse = |t: &Option<String>, field: &str| -> Result<_, ApiError> {
        match t {
            Some(s) => Ok(Some(
                crate::audit::Timestamp::parse_rfc3339(s)
                    .map_err(|e| Error::invalid_options(field, e.message))?,
            )),
            None => Ok(None),
        }
    };
    let query = AuditQuery {
        success: q.success,
        tenant: q.tenant,
        engine: q.engine,
        after: parse(&q.after, "after")?,
        before: parse(&q.before, "before")?,
        limit: q.limit,
    };
    let entries = state.paddock.audit(&caller, query).await?;
    Ok(HttpResponse::Ok().json(entries))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitParam {
    limit: Option<usize>,
}

async fn operator_accesses(
    state: Shared,
    req: HttpRequest,
    q: web::Query<LimitParam>,
) -> Result<HttpResponse, ApiError> {
    let caller = caller(&state.config, &req)?;
    let limit = q.limit.unwrap_or(crate::audit::DEFAULT_SEARCH_LIMIT);
    // Without API keys there are no operators: nobody gets the record.
    let caller = match caller {
        Caller::Operator(_) => caller,
        _ => Caller::tenant(""),
    };
    let accesses = state.paddock.operator_accesses(&caller, limit).await?;
    Ok(HttpResponse::Ok().json(accesses))
}

async fn stats(state: Shared, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let caller = caller(&state.config, &req)?;
    let stats = state.paddock.stats_for(&caller).await?;
    let audit = state.paddock.audit_statistics(&caller).await?;
    let (total, own) = state.results.bytes(account(&caller).as_deref());
    let results = match caller.confined_to() {
        Some(_) => serde_json::json!({
            "bytes": own,
            "max_bytes": state.config.max_result_bytes_per_tenant,
        }),
        None => serde_json::json!({
            "bytes": total,
            "max_bytes": state.config.max_result_bytes,
        }),
    };
    Ok(HttpResponse::Ok()
        .json(serde_json::json!({"scheduler": stats, "audit": audit, "results": results})))
}

/// `/metrics` on the API's address: open, for operator keys only, or not here at all
/// (`server.metrics`). It carries no tenant names or ids.
async fn metrics(state: Shared, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    match &state.metrics {
        MetricsAccess::Open => {}
        MetricsAccess::Operator => {
            if !caller(&state.config, &req)?.is_operator() {
                return Err(Error::new(
                    ErrorCode::NotFound,
                    "/metrics is served to operator keys only (server.metrics = \"operator\")",
                )
                .into());
            }
        }
        MetricsAccess::Listen(at) => {
            return Err(Error::new(
                ErrorCode::NotFound,
                format!("/metrics is served on {at} (server.metrics)"),
            )
            .into());
        }
    }
    Ok(metrics_only(state).await)
}

async fn metrics_only(state: Shared) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(paddock_telemetry::PROMETHEUS_CONTENT_TYPE)
        .body(state.paddock.telemetry().render_prometheus())
}

async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().json(openapi::document())
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

async fn readyz(state: Shared) -> HttpResponse {
    if state.draining.load(Ordering::Acquire) {
        return HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "draining"}));
    }
    match state.paddock.stats().await {
        Ok(s) if s.admitting => HttpResponse::Ok().json(serde_json::json!({"status": "ready"})),
        _ => HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "not ready"})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test;

    #[actix_web::test]
    async fn every_documented_route_is_served() {
        let paddock = Paddock::builder()
            .without_subprocess()
            .without_isolate()
            .engine(Arc::new(paddock_engines::noop::NoopEngine::new()))
            .start()
            .unwrap();
        let config = ServerConfig::default();
        let state = Arc::new(State::new(paddock.clone(), config).unwrap());
        let app = test::init_service(
            App::new()
                .app_data(web::Data::from(state))
                .configure(routes),
        )
        .await;
        for (method, path, _, _) in openapi::ROUTES {
            let uri = path
                .replace("{id}", "01a2299e-3e83-714b-8bc9-412c5fb1452d")
                .replace("{path}", "f");
            let method =
                actix_web::http::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let req = test::TestRequest::default()
                .method(method.clone())
                .uri(&uri)
                .set_payload("{\"program\":{\"command\":[\"x\"]}}")
                .to_request();
            let resp = test::call_service(&app, req).await;
            let body = test::read_body(resp).await;
            assert!(
                !String::from_utf8_lossy(&body).contains("no such route"),
                "{method} {path} is documented but not served"
            );
        }
        // A wrongly typed field is named in the 400.
        let req = test::TestRequest::post()
            .uri("/v1/executions")
            .set_payload(r#"{"program":{"command":["true"]},"stdin":5}"#)
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let body: serde_json::Value = test::read_body_json(resp).await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("`stdin`"), "{message}");
        // And an undocumented one is not.
        let req = test::TestRequest::get()
            .uri("/v1/nothing-here")
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        paddock.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}
