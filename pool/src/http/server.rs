//! The server itself: its shared state, starting it, and its handle.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, App, HttpServer};
use paddock_core::{Error, ErrorCode, MetricsAccess, ServerConfig};

use super::results::{Bounds, ResultStore};
use super::tenancy::Gauge;
use super::*;
use super::{operations::*, routes::*};
use crate::Paddock;

/// Shared by every worker.
#[derive(Debug)]
pub(super) struct State {
    pub(super) paddock: Paddock,
    pub(super) config: ServerConfig,
    pub(super) results: ResultStore,
    pub(super) draining: AtomicBool,
    /// Requests in progress per tenant (streamed responses until they end).
    pub(super) requests: Arc<Gauge>,
    /// Open WebSockets per tenant.
    pub(super) websockets: Arc<Gauge>,
    /// Where `/metrics` is served.
    pub(super) metrics: MetricsAccess,
}

impl State {
    pub(super) fn new(paddock: Paddock, config: ServerConfig) -> Result<State, Error> {
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
    start_with(paddock, config, Vec::new())
}

/// Routes of another surface served on the same listener (the E2B-compatible API):
/// registered on every worker's app, ahead of the native routes.
pub type Extension = Arc<dyn Fn(&mut web::ServiceConfig) + Send + Sync>;

/// [`start`], with `extensions` served on the same listener ahead of the native
/// routes; the native middleware (tenants' request caps, fleet forwarding of
/// `/v1/sandboxes/…`) wraps them too.
pub fn start_with(
    paddock: Paddock,
    config: ServerConfig,
    extensions: Vec<Extension>,
) -> Result<HttpServerHandle, Error> {
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
                // How long a closing connection waits for its client: what a
                // WebSocket close costs (actix's 1 s default made every close take
                // most of a second), and the grace an early answer to an unread
                // upload gets.
                let close_linger =
                    std::time::Duration::from_millis(app_state.config.close_linger_ms);
                let metrics = app_state.metrics.clone();
                let data = web::Data::from(app_state);
                let metrics_data = data.clone();
                let server = HttpServer::new(move || {
                    let mut app = App::new()
                        .app_data(data.clone())
                        .wrap(actix_web::middleware::from_fn(forward::route_sessions))
                        .wrap(actix_web::middleware::from_fn(tenancy::limit_requests));
                    for extension in &extensions {
                        app = app.configure(|cfg| extension(cfg));
                    }
                    app.configure(routes)
                })
                // Streamed answers (NDJSON, Connect streams) go out in small writes:
                // with Nagle's algorithm each would wait for the client's delayed ACK
                // (40 ms here) behind the one before it.
                .on_connect(|conn, _| {
                    if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
                        let _ = tcp.set_nodelay(true);
                    }
                })
                .workers(workers)
                .disable_signals()
                .shutdown_timeout(30)
                .client_disconnect_timeout(close_linger)
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
