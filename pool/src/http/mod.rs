//! The HTTP API (`paddock serve`): JSON over actix-web, on top of the [`Paddock`]
//! handle. See `docs/http-api.md` for every route.
//!
//! [`start`] runs the server on its own thread (its own actix system) and returns the
//! bound address; [`HttpServerHandle::stop`] stops it gracefully.

mod errors;
mod interactive;
mod openapi;
mod results;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::{header, StatusCode};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use bytes::Bytes;
use paddock_core::api::{ExecBody, SandboxBody};
use paddock_core::{EngineKind, Error, ErrorCode, ExecutionId, SandboxSpec, ServerConfig};
use serde::Deserialize;
use subtle::ConstantTimeEq;

pub use errors::{status_for, ApiError};
use results::{Answer, Begin, ResultStore};

use crate::audit::AuditQuery;
use crate::{Execute, Paddock, StreamEvent};

/// Shared by every worker.
#[derive(Debug)]
struct State {
    paddock: Paddock,
    config: ServerConfig,
    results: ResultStore,
    draining: AtomicBool,
}

/// A running server.
#[derive(Debug)]
pub struct HttpServerHandle {
    addr: SocketAddr,
    state: Arc<State>,
    server: actix_web::dev::ServerHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServerHandle {
    /// The address the server is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops admitting work: new executions get 503 and `/readyz` fails.
    pub fn begin_drain(&self) {
        self.state.draining.store(true, Ordering::Release);
    }

    /// Stops the server (after in-flight requests finish) and joins its thread.
    pub async fn stop(mut self) {
        self.begin_drain();
        self.server.stop(true).await;
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// Starts the HTTP server for `paddock` with `config`.
pub fn start(paddock: Paddock, config: ServerConfig) -> Result<HttpServerHandle, Error> {
    config.validate()?;
    let listen: SocketAddr = config
        .listen
        .parse()
        .map_err(|e| Error::invalid_config("server.listen", e))?;
    let state = Arc::new(State {
        results: ResultStore::new(
            Duration::from_secs(config.result_retention_s),
            config.max_results,
        ),
        paddock,
        config,
        draining: AtomicBool::new(false),
    });
    let app_state = state.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("paddock-http".into())
        .spawn(move || {
            let system = actix_rt::System::new();
            system.block_on(async move {
                let workers = app_state.config.workers;
                let data = web::Data::from(app_state);
                let server =
                    HttpServer::new(move || App::new().app_data(data.clone()).configure(routes))
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
                let running = server.run();
                let _ = tx.send(Ok((addr, running.handle())));
                let _ = running.await;
            });
        })
        .map_err(|e| Error::engine_io("starting the HTTP thread", e))?;
    let (addr, server) = rx
        .recv()
        .map_err(|_| Error::new(ErrorCode::EngineFailed, "the HTTP thread failed to start"))??;
    Ok(HttpServerHandle {
        addr,
        state,
        server,
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

/// The caller's tenant, allowed to use `sandbox`: a sandbox opened for one tenant is
/// `NOT_FOUND` to every other, so ids of other tenants' sandboxes neither work nor
/// show that they exist. A destroyed sandbox stays 409 `ENGINE_DISPOSED` (its owner is
/// no longer known).
async fn sandbox_access(
    state: &State,
    req: &HttpRequest,
    sandbox: &str,
) -> Result<Option<String>, ApiError> {
    let caller = tenant(state, req)?;
    let owner = ask(
        state.paddock.supervisor(),
        crate::messages::SandboxTenant(sandbox.to_string()),
    )
    .await?;
    if owner != caller {
        return Err(Error::new(
            ErrorCode::NotFound,
            format!("no sandbox with id `{sandbox}`; open one first"),
        )
        .into());
    }
    Ok(caller)
}

/// The tenant of a request: the API key's when keys are configured (401 without a
/// valid key), else the `X-Paddock-Tenant` header.
fn tenant(state: &State, req: &HttpRequest) -> Result<Option<String>, ApiError> {
    if state.config.api_keys.is_empty() {
        return Ok(req
            .headers()
            .get("x-paddock-tenant")
            .and_then(|v| v.to_str().ok())
            .filter(|t| !t.is_empty())
            .map(str::to_owned));
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // Compare against every key in constant time; no early exit on a match.
    let mut found: Option<&str> = None;
    for k in &state.config.api_keys {
        let eq: bool = k.key.as_bytes().ct_eq(presented.as_bytes()).into();
        if eq && found.is_none() {
            found = Some(&k.tenant);
        }
    }
    match found {
        Some(t) => Ok(Some(t.to_string())),
        None => Err(ApiError::with_status(
            StatusCode::UNAUTHORIZED,
            ErrorCode::InvalidOptions,
            "missing or wrong API key: send `Authorization: Bearer <key>`",
        )),
    }
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
    let tenant = tenant(&state, &req)?;
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
    match state
        .results
        .begin(&id, tenant.as_deref().unwrap_or(""), key.as_deref())
    {
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
                let stream = state
                    .paddock
                    .execute_stream(msg)
                    .await
                    .map_err(|e| refusal(&state, e))?;
                Ok(stream_response(state.into_inner(), stream, id, Some(tx)))
            } else {
                let answer = Arc::new(state.paddock.execute_with(msg).await);
                if answer.as_ref().as_ref().is_err_and(retryable) {
                    state.results.finish_and_forget(&id, tx, answer.clone());
                } else {
                    state.results.finish(&id, tx, answer.clone());
                }
                Ok(answer_json(&state, &answer))
            }
        }
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
                        if answer.as_ref().as_ref().is_err_and(retryable) {
                            state.results.finish_and_forget(&id, tx, answer);
                        } else {
                            state.results.finish(&id, tx, answer);
                        }
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

/// Asks the supervisor; a supervisor that no longer answers is `ENGINE_FAILED`.
async fn ask<M, R>(supervisor: actix::Addr<crate::Supervisor>, msg: M) -> Result<R, Error>
where
    M: actix::Message<Result = Result<R, Error>> + Send + 'static,
    R: Send + 'static,
    crate::Supervisor: actix::Handler<M>,
{
    supervisor.send(msg).await.map_err(|e| {
        Error::new(
            ErrorCode::EngineFailed,
            format!("the scheduler did not answer ({e}); retry"),
        )
    })?
}

fn parse_id(raw: &str) -> Result<ExecutionId, ApiError> {
    Ok(ExecutionId::parse(raw)?)
}

async fn get_execution(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    tenant(&state, &req)?;
    let id = parse_id(&path)?;
    match state.results.get(&id) {
        Some(Some(answer)) => Ok(answer_json(&state, &answer)),
        Some(None) => {
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
    tenant(&state, &req)?;
    let id = parse_id(&path)?;
    let cancelled = state.paddock.cancel(&id);
    if !cancelled && state.results.get(&id).is_none() {
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
    let tenant = tenant(&state, &req)?;
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
    let sandbox = path.into_inner();
    match sandbox_access(&state, &req, &sandbox).await {
        // A destroyed sandbox answers its status.
        Err(e) if e.error.code == ErrorCode::EngineDisposed => {}
        other => {
            other?;
        }
    }
    let status = ask(state.paddock.supervisor(), crate::GetSandboxStatus(sandbox)).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"status": status})))
}

async fn destroy_sandbox(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let sandbox = path.into_inner();
    match sandbox_access(&state, &req, &sandbox).await {
        // Destroying a destroyed sandbox succeeds (idempotent).
        Err(e) if e.error.code == ErrorCode::EngineDisposed => {}
        other => {
            other?;
        }
    }
    ask(state.paddock.supervisor(), crate::DestroySandbox(sandbox)).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn pause_sandbox(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let sandbox = path.into_inner();
    sandbox_access(&state, &req, &sandbox).await?;
    ask(state.paddock.supervisor(), crate::PauseSandbox { sandbox }).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"status": "paused"})))
}

async fn unpause_sandbox(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let sandbox = path.into_inner();
    sandbox_access(&state, &req, &sandbox).await?;
    ask(
        state.paddock.supervisor(),
        crate::UnpauseSandbox { sandbox },
    )
    .await?;
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
    let sandbox = path.into_inner();
    let tenant = sandbox_access(&state, &req, &sandbox).await?;
    let body: ExecBody = parse_body(&state, payload).await?;
    let (request, _, _, _) = body.into_request(tenant);
    if query.stream {
        let id = request.id.clone();
        let sub = state.paddock.subscribe(id.clone()).await?;
        let supervisor = state.paddock.supervisor();
        let result = Box::pin(async move {
            ask(
                supervisor,
                crate::SandboxExec {
                    sandbox,
                    request,
                    sink: None,
                },
            )
            .await
        });
        let stream = crate::ExecutionStream::from_parts(sub, result);
        return Ok(stream_response(state.into_inner(), stream, id, None));
    }
    let r = ask(
        state.paddock.supervisor(),
        crate::SandboxExec {
            sandbox,
            request,
            sink: None,
        },
    )
    .await
    .map_err(|e| refusal(&state, e))?;
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
    let sandbox = path.into_inner();
    sandbox_access(&state, &req, &sandbox).await?;
    let files = ask(
        state.paddock.supervisor(),
        crate::ListFiles {
            sandbox,
            path: q.dir.clone(),
        },
    )
    .await?;
    let out: Vec<_> = files
        .iter()
        .map(|f| serde_json::json!({"path": f.path, "size": f.size, "is_dir": f.is_dir}))
        .collect();
    Ok(HttpResponse::Ok().json(out))
}

async fn read_file(
    state: Shared,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (sandbox, file) = path.into_inner();
    sandbox_access(&state, &req, &sandbox).await?;
    let data = ask(
        state.paddock.supervisor(),
        crate::ReadFile {
            sandbox,
            path: file,
        },
    )
    .await?;
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .body(data))
}

async fn write_file(
    state: Shared,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    admitting(&state)?;
    let (sandbox, file) = path.into_inner();
    sandbox_access(&state, &req, &sandbox).await?;
    let data = read_body(
        payload,
        state.config.max_file_bytes,
        "upload (server.max_file_bytes)",
    )
    .await?;
    ask(
        state.paddock.supervisor(),
        crate::WriteFile {
            sandbox,
            path: file,
            data,
        },
    )
    .await?;
    Ok(HttpResponse::NoContent().finish())
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
    tenant(&state, &req)?;
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
    let entries = state.paddock.audit(query).await?;
    Ok(HttpResponse::Ok().json(entries))
}

async fn stats(state: Shared, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    tenant(&state, &req)?;
    let stats = state.paddock.stats().await?;
    let audit = state.paddock.audit_statistics().await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"scheduler": stats, "audit": audit})))
}

async fn metrics(state: Shared) -> HttpResponse {
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
        let state = Arc::new(State {
            results: ResultStore::new(Duration::from_secs(60), 100),
            paddock: paddock.clone(),
            config,
            draining: AtomicBool::new(false),
        });
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
