//! The server itself: its shared state, starting it, and its handle.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, App, HttpServer};
use paddock_core::{Error, ErrorCode};

use super::{MetricsAccess, ServerConfig};
use super::gate::RequestGate;
use super::results::{Bounds, ResultStore};
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
    /// Requests in progress and open WebSockets per tenant (streamed responses
    /// until they end), shared with every surface on the listener.
    pub(super) gate: Arc<RequestGate>,
    /// Where `/metrics` is served.
    pub(super) metrics: MetricsAccess,
}

impl State {
    /// How long a closing connection waits for its client (`server.close_linger_ms`).
    pub(super) fn close_linger(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.config.close_linger_ms)
    }

    pub(super) fn new(paddock: Paddock, config: ServerConfig) -> Result<State, Error> {
        let metrics = config.metrics_access()?;
        Ok(State {
            results: ResultStore::new(Bounds {
                retention: Duration::from_secs(config.result_retention_s),
                max: config.max_results,
                max_bytes: config.max_result_bytes,
                max_bytes_per_tenant: config.max_result_bytes_per_tenant,
            }),
            gate: Arc::new(RequestGate::new(&config)),
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
    tls_addr: Option<SocketAddr>,
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

    /// The address of the TLS listener, when `[server.tls]` configures one.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
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
/// routes. They find the listener's [`RequestGate`] in their app data
/// (`web::Data<RequestGate>`) and count their requests in it, so that a tenant's
/// caps hold across every surface; the native middleware (its count of native
/// requests, fleet forwarding of `/v1/sandboxes/…`) wraps the native routes only.
pub fn start_with(
    paddock: Paddock,
    config: ServerConfig,
    extensions: Vec<Extension>,
) -> Result<HttpServerHandle, Error> {
    config.validate()?;
    // (Private ranges are `[egress]`'s to allow, which this section does not hold.)
    if paddock.access_rules().without_private() != config.access_rules().without_private() {
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
    let tls = match &config.tls {
        Some(t) => Some((
            t.listen
                .parse::<SocketAddr>()
                .map_err(|e| Error::invalid_config("server.tls.listen", e))?,
            tls_config(t)?,
        )),
        None => None,
    };
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
                // How long a new connection has to send its first request's head
                // (actix answers 408 and closes past it).
                let header_read_timeout =
                    std::time::Duration::from_millis(app_state.config.header_read_timeout_ms);
                let unauthenticated = super::connections::Gate::new(
                    app_state.config.max_unauthenticated_connections,
                    app_state.config.max_unauthenticated_connections_per_address,
                );
                let metrics = app_state.metrics.clone();
                let data = web::Data::from(app_state);
                let gate = web::Data::from(data.gate.clone());
                let metrics_data = data.clone();
                let server = HttpServer::new(move || {
                    let mut app = App::new()
                        .app_data(data.clone())
                        // The one gate of every surface: each counts its own
                        // requests in it and answers a refusal in its own format.
                        .app_data(gate.clone())
                        // Outermost: every body, whoever reads it, is read in time.
                        .wrap(actix_web::middleware::from_fn(deadline::time_bodies));
                    for extension in &extensions {
                        app = app.configure(|cfg| extension(cfg));
                    }
                    // The native routes take every request the extensions did not.
                    app.service(
                        web::scope("")
                            .wrap(actix_web::middleware::from_fn(forward::route_sessions))
                            .wrap(actix_web::middleware::from_fn(tenancy::limit_requests))
                            .configure(routes),
                    )
                })
                // Streamed answers (NDJSON, Connect streams) go out in small writes:
                // with Nagle's algorithm each would wait for the client's delayed ACK
                // (40 ms here) behind the one before it.
                .tcp_nodelay(true)
                // Each connection's socket, for noticing a client that went away
                // while its answer is silent (`client_gone`), and its place among
                // the connections without a credential (`connections`).
                .on_connect(super::connections::on_connect(unauthenticated))
                .client_request_timeout(header_read_timeout)
                .workers(workers)
                .disable_signals()
                .shutdown_timeout(30)
                .client_disconnect_timeout(close_linger)
                .bind(listen);
                let mut server = match server {
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
                let mut tls_addr = None;
                if let Some((at, rustls)) = tls {
                    server = match server.bind_rustls_0_23(at, rustls) {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = tx.send(Err(Error::invalid_config(
                                "server.tls.listen",
                                format!("cannot listen on {at}: {e}"),
                            )));
                            return;
                        }
                    };
                    tls_addr = server
                        .addrs_with_scheme()
                        .into_iter()
                        .find(|(_, scheme)| *scheme == "https")
                        .map(|(a, _)| a);
                }
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
                let _ = tx.send(Ok((addr, tls_addr, running.handle(), metrics_server)));
                let _ = running.await;
            });
        })
        .map_err(|e| Error::engine_io("starting the HTTP thread", e))?;
    let (addr, tls_addr, server, metrics_server) = rx
        .recv()
        .map_err(|_| Error::new(ErrorCode::EngineFailed, "the HTTP thread failed to start"))??;
    let (metrics_addr, metrics_server) = match metrics_server {
        Some((a, h)) => (Some(a), Some(h)),
        None => (None, None),
    };
    Ok(HttpServerHandle {
        addr,
        tls_addr,
        metrics_addr,
        state,
        server,
        metrics_server,
        thread: Some(thread),
    })
}

/// The TLS settings of `[server.tls]`: its certificate chain and key, read now (an
/// unreadable or unusable one is `INVALID_CONFIG` naming the field), on rustls with
/// the ring provider; actix offers HTTP/1.1 by ALPN.
fn tls_config(t: &super::TlsConfig) -> Result<rustls::ServerConfig, Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&t.cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| {
            Error::invalid_config(
                "server.tls.cert",
                format!("cannot read certificates from `{}`: {e}", t.cert.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(Error::invalid_config(
            "server.tls.cert",
            format!("`{}` holds no PEM certificate", t.cert.display()),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&t.key).map_err(|e| {
        Error::invalid_config(
            "server.tls.key",
            format!("cannot read a private key from `{}`: {e}", t.key.display()),
        )
    })?;
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::invalid_config("server.tls", e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            Error::invalid_config(
                "server.tls.key",
                format!("the key does not go with the certificate, or is unusable: {e}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_tls_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        let t = crate::http::TlsConfig {
            listen: "127.0.0.1:0".into(),
            cert: cert.clone(),
            key: key.clone(),
        };
        let e = tls_config(&t).unwrap_err();
        assert!(e.message.contains("`server.tls.cert`: cannot read"), "{e}");
        std::fs::write(&cert, "not a certificate\n").unwrap();
        let e = tls_config(&t).unwrap_err();
        assert!(e.message.contains("holds no PEM certificate"), "{e}");
        // A PEM block that is no certificate of rustls's liking still reads as one;
        // the key is what is missing then.
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::write(&key, "no key here\n").unwrap();
        let e = tls_config(&t).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert!(e.message.contains("`server.tls.key`"), "{e}");
    }
}
