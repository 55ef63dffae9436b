//! A whole node, as `paddock serve` runs it: the scheduler with the built-in engines,
//! its fleet membership when the config names NATS servers (with the tenants' rate
//! and concurrency caps counted fleet-wide), the E2B-compatible API when enabled,
//! the HTTP server on the facade, and a graceful stop that leaves the fleet.
//!
//! The binary parses its arguments, sets up logging, starts a [`Node`], says where
//! it listens and stops it on a signal; an embedder or a test starts as many nodes
//! in one process as it likes, each with its own config and listener:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = paddock::PaddockConfig::default();
//! config.server.listen = "127.0.0.1:0".into();
//! let node = paddock::node::Node::start(config).await?;
//! println!("serving on http://{}", node.local_addr());
//! let drain = node.drain();
//! let report = node.stop(drain).await?;
//! println!("{} sandboxes destroyed", report.sandboxes_destroyed);
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use paddock_core::Error;
use paddock_e2b::E2bApi;
use paddock_fleet::{Fleet, JoinError, ShareCaps};
use paddock_pool::http::{Extension, HttpServerHandle};
use paddock_pool::{Paddock, ShutdownReport};

use crate::PaddockConfig;

/// Why a node did not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The config is not valid, or the scheduler did not start.
    #[error("{0}")]
    Start(Error),
    /// The node could not join its fleet.
    #[error("{0}")]
    Join(JoinError),
    /// The E2B-compatible API's settings are not usable.
    #[error("{0}")]
    E2b(Error),
    /// The HTTP server did not start (its listener, its TLS settings).
    #[error("{0}")]
    Serve(Error),
}

/// A running node: stop it with [`stop`](Self::stop). Dropping it stops nothing.
#[derive(Debug)]
pub struct Node {
    paddock: Paddock,
    fleet: Option<Fleet>,
    e2b: Option<E2bApi>,
    server: HttpServerHandle,
    drain: Duration,
}

impl Node {
    /// Starts a node on `config`: the scheduler, then its fleet membership (when
    /// `fleet.urls` is set), then the E2B-compatible API (when `e2b.enabled`), then
    /// the HTTP server on `server.listen` (port 0 picks a free port), advertised to
    /// the fleet. What started before a step that fails is stopped again.
    ///
    /// In a fleet, the tenants' rate (`limiter.max_executions_per_window`) is
    /// counted fleet-wide where a node accepts work, and not again by the node's own
    /// limiter (which would count it per node); the concurrency caps are counted
    /// fleet-wide and kept by the node's limiter too (they then bite only on what
    /// the fleet does not count: executions inside a sandbox).
    pub async fn start(mut config: PaddockConfig) -> Result<Node, NodeError> {
        config.validate().map_err(NodeError::Start)?;
        let server_config = config.server.clone();
        let e2b_config = config.e2b.clone();
        let templates = config.templates.clone();
        let fleet_config = config.fleet.clone();
        let fleet_rate = if fleet_config.enabled() {
            config
                .limiter
                .max_executions_per_window
                .take()
                .map(|max| (max, config.limiter.window_ms))
        } else {
            None
        };
        let caps = ShareCaps {
            max_concurrent: config.limiter.max_concurrent_per_tenant,
            max_slots: config.limiter.max_slots_per_tenant,
            max_sandboxes: config.limiter.max_sandboxes_per_tenant,
            default_timeout_ms: config
                .limits
                .defaults
                .timeout_ms
                .or(paddock_core::Limits::defaults().timeout_ms)
                .unwrap_or(30_000),
        };
        let drain = Duration::from_millis(server_config.drain_ms);
        let paddock = crate::builder()
            .config(config)
            .start()
            .map_err(NodeError::Start)?;
        // In a fleet, the server stands on the federated facade.
        let fleet = if fleet_config.enabled() {
            match Fleet::join(paddock.clone(), fleet_config).await {
                Ok(f) => Some(f),
                Err(e) => {
                    let _ = paddock.shutdown(Duration::ZERO).await;
                    return Err(NodeError::Join(e));
                }
            }
        } else {
            None
        };
        if let Some(f) = &fleet {
            if let Some((max, window_ms)) = fleet_rate {
                f.limit_rate(max, window_ms);
            }
            f.limit_shares(caps);
        }
        let facade = fleet
            .as_ref()
            .map_or_else(|| paddock.clone(), Fleet::paddock);
        let e2b = if e2b_config.enabled {
            match E2bApi::new(facade.clone(), e2b_config, &server_config, templates) {
                Ok(api) => Some(api),
                Err(e) => {
                    abandon(&paddock, fleet.as_ref()).await;
                    return Err(NodeError::E2b(e));
                }
            }
        } else {
            None
        };
        let extensions: Vec<Extension> = e2b
            .iter()
            .map(|api| {
                let api = api.clone();
                Arc::new(move |cfg: &mut actix_web::web::ServiceConfig| api.configure(cfg))
                    as Extension
            })
            .collect();
        let server = match paddock_pool::http::start_with(facade, server_config, extensions) {
            Ok(s) => s,
            Err(e) => {
                abandon(&paddock, fleet.as_ref()).await;
                return Err(NodeError::Serve(e));
            }
        };
        if let Some(f) = &fleet {
            f.advertise(format!("http://{}", server.local_addr()));
        }
        Ok(Node {
            paddock,
            fleet,
            e2b,
            server,
            drain,
        })
    }

    /// The node's own scheduler (in a fleet, the one its fleet membership runs the
    /// fleet's work on).
    pub fn paddock(&self) -> &Paddock {
        &self.paddock
    }

    /// The facade the HTTP server stands on: the fleet's, in a fleet; else the
    /// node's own.
    pub fn facade(&self) -> Paddock {
        self.fleet
            .as_ref()
            .map_or_else(|| self.paddock.clone(), Fleet::paddock)
    }

    /// Its fleet membership, in a fleet.
    pub fn fleet(&self) -> Option<&Fleet> {
        self.fleet.as_ref()
    }

    /// The E2B-compatible API, when enabled.
    pub fn e2b(&self) -> Option<&E2bApi> {
        self.e2b.as_ref()
    }

    /// The HTTP server.
    pub fn server(&self) -> &HttpServerHandle {
        &self.server
    }

    /// The address the HTTP server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// How long a stop lets running work finish (`server.drain_ms`).
    pub fn drain(&self) -> Duration {
        self.drain
    }

    /// Stops gracefully: admits no more work, closes the E2B API's sandboxes, leaves
    /// the fleet (what runs here may finish for up to `drain`; what is still running
    /// then is left to another node to take over), shuts the scheduler down with
    /// the same `drain`, and stops the server.
    pub async fn stop(self, drain: Duration) -> Result<ShutdownReport, Error> {
        self.server.begin_drain();
        if let Some(api) = &self.e2b {
            api.close_all().await;
        }
        if let Some(f) = &self.fleet {
            // Stop taking the fleet's work, and let what runs here finish first.
            f.leave(drain).await;
        }
        let report = self.paddock.shutdown(drain).await;
        self.server.stop().await;
        report
    }
}

/// Undoes a start that failed after the scheduler started.
async fn abandon(paddock: &Paddock, fleet: Option<&Fleet>) {
    if let Some(f) = fleet {
        f.leave(Duration::ZERO).await;
    }
    let _ = paddock.shutdown(Duration::ZERO).await;
}
