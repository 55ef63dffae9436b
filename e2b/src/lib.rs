//! Paddock's E2B-compatible API: code written against E2B's SDKs (Python `e2b`,
//! `e2b-code-interpreter`, JavaScript `e2b`) runs on Paddock unchanged.
//!
//! It is a surface over the [`Paddock`] facade, like the native HTTP API, and is
//! served on the same listener (see `docs/e2b.md`):
//! - the **control plane**: `POST /v2/sandboxes` (and `/sandboxes`), `GET`/`DELETE
//!   /sandboxes/{id}`, the list, `timeout`, `pause`, `connect` and `resume`;
//! - the **sandbox agent** ("envd") of each sandbox, reached with the
//!   `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers or a `{port}-{id}.{domain}`
//!   host name: the `process.Process` and `filesystem.Filesystem` Connect services
//!   with JSON messages, `/files` and `/health`.
//!
//! Each sandbox is a Paddock session opened from a template (`[templates.NAME]`)
//! with its workdir at `/home/user`. `X-API-Key` is checked against the server's API
//! keys and gives the tenant; each sandbox has an access token of its own, which its
//! agent's routes require.
//!
//! ```no_run
//! # async fn serve() -> Result<(), paddock_core::Error> {
//! use paddock_e2b::E2bConfig;
//! use paddock_pool::http::ServerConfig;
//!
//! // The scheduler with the built-in engines (the `paddock` crate).
//! let paddock = paddock::builder().start()?;
//! let server = ServerConfig::default();
//! let api = paddock_e2b::E2bApi::new(paddock.clone(), E2bConfig::default(), &server, Default::default())?;
//! let routes: paddock_pool::http::Extension = std::sync::Arc::new(move |cfg| api.configure(cfg));
//! let http = paddock_pool::http::start_with(paddock, server, vec![routes])?;
//! println!("E2B_API_URL=http://{}", http.local_addr());
//! # Ok(()) }
//! ```

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unused_must_use, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

mod access;
mod admission;
mod caps;
mod config;
mod connect;
mod control;
mod errors;
mod files;
mod forward;
mod interpreter;
mod metrics;
mod process;
mod registry;
mod routing;
mod signed;
pub mod table;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;

use actix_web::web;
use paddock_core::Error;
use paddock_pool::http::ServerConfig;
use paddock_pool::Paddock;

pub use config::{
    builtin_templates, check_template_name, E2bConfig, TemplateConfig, BASE_TEMPLATE,
    CODE_INTERPRETER_TEMPLATE, E2B_HOME,
};
pub use registry::ENVD_VERSION;

/// The port of the sandbox agent ("envd") in E2B's addressing.
pub const ENVD_PORT: u16 = 49983;
/// The port of the code interpreter in E2B's addressing.
pub const CODE_INTERPRETER_PORT: u16 = 49999;

/// The E2B-compatible API over one [`Paddock`] handle.
#[derive(Clone)]
pub struct E2bApi {
    inner: Arc<registry::Inner>,
}

impl std::fmt::Debug for E2bApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bApi")
            .field("sandboxes", &self.inner.sandboxes.len())
            .finish_non_exhaustive()
    }
}

impl E2bApi {
    /// The API over `paddock`, with `config`, the server's settings (its API keys:
    /// none means no key is checked and sandboxes belong to no tenant; its file size
    /// cap) and the configured templates added to (or replacing) the built-in ones.
    /// Starts the task that ends sandboxes whose lifetime has passed; it needs a
    /// Tokio runtime.
    pub fn new(
        paddock: Paddock,
        config: E2bConfig,
        server: &ServerConfig,
        templates: BTreeMap<String, TemplateConfig>,
    ) -> Result<E2bApi, Error> {
        config.validate()?;
        let mut all = crate::builtin_templates();
        for (name, t) in templates {
            crate::check_template_name(&name)?;
            t.validate(&name)?;
            all.insert(name, t);
        }
        let inner = Arc::new(registry::Inner::new(paddock, config, server, all));
        registry::spawn_reaper(&inner);
        // Templates that ask for sandboxes kept ready get their pools now.
        let warm: Vec<_> = inner
            .templates
            .iter()
            .filter_map(|(name, t)| {
                let n = t.warm_pool?;
                let engine = match &t.engine {
                    Some(e) => e.clone(),
                    None => match control::default_engine(&inner, name) {
                        Ok(e) => e,
                        Err(e) => {
                            tracing::warn!(template = %name, error = %e, "the template's pool is not kept warm");
                            return None;
                        }
                    },
                };
                let spec = paddock_core::SandboxSpec {
                    level: t.level,
                    network: t.network.clone(),
                    limits: t.limits.clone(),
                    tenant: None,
                    home: Some(t.home.clone()),
                };
                Some((name.clone(), engine, spec, n))
            })
            .collect();
        if !warm.is_empty() {
            let paddock = inner.paddock.clone();
            tokio::spawn(async move {
                for (name, engine, spec, n) in warm {
                    if let Err(e) = paddock.warm_pool(engine, spec, n).await {
                        tracing::warn!(template = %name, error = %e, "the template's pool could not be kept warm");
                    }
                }
            });
        }
        Ok(E2bApi { inner })
    }

    /// Registers the API's routes on an actix-web app, ahead of the native ones: the
    /// sandbox routes (chosen by header or host name, whatever the path) first, then
    /// the control plane's paths.
    pub fn configure(&self, cfg: &mut web::ServiceConfig) {
        routing::configure(&self.inner, cfg);
    }

    /// How many E2B sandboxes are open.
    pub fn open_sandboxes(&self) -> usize {
        self.inner.sandboxes.len()
    }

    /// Ends every E2B sandbox (at shutdown).
    pub async fn close_all(&self) {
        self.inner.close_all().await;
    }
}
