//! The E2B sandboxes open on this server: their Paddock sessions, tokens, metadata,
//! lifetimes and processes, and who may reach them.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use dashmap::DashMap;
use paddock_pool::http::ApiKey;
use paddock_pool::{Caller, Paddock, SandboxHandle};
use subtle::ConstantTimeEq;

use crate::config::{E2bConfig, TemplateConfig};

/// The version of E2B's sandbox agent whose features Paddock's agent routes give:
/// the SDKs gate features by it (stdin closing needs 0.5.2; octet-stream and gzip
/// uploads 0.5.7; file metadata 0.6.2; a watch event's entry 0.6.3; the watch
/// option for network mounts 0.6.4).
pub const ENVD_VERSION: &str = "0.6.4";

/// How often the reaper looks for sandboxes whose lifetime has passed.
const REAP_EVERY: Duration = Duration::from_millis(250);
/// How often it asks each sandbox's session whether it is still there (well below
/// the pool's idle timeout, which each such look resets).
const PROBE_EVERY: Duration = Duration::from_secs(10);
/// Most sandboxes ended (or probed) at once.
const ENDING_AT_ONCE: usize = 16;

/// One E2B sandbox.
pub(crate) struct Sbx {
    pub(crate) id: String,
    pub(crate) template: String,
    pub(crate) caller: Caller,
    pub(crate) handle: SandboxHandle,
    /// Required in `X-Access-Token` by the agent's routes.
    pub(crate) token: String,
    /// Taken instead of `token` by the code interpreter's routes, in
    /// `E2B-Traffic-Access-Token` (the SDK sends `X-Access-Token` only with
    /// `/execute`, and this one with every call), and required by the sandbox's own
    /// ports unless it is public. Made for a code interpreter and for every sandbox
    /// whose ports are not public.
    pub(crate) traffic_token: Option<String>,
    /// Who may reach its own ports (`network.allowPublicTraffic`).
    pub(crate) ingress: crate::access::Ingress,
    /// The `Host` its servers see on requests to its ports (`maskRequestHost`,
    /// `${PORT}` standing for the port); `None`: the caller's.
    pub(crate) mask_host: Option<String>,
    /// Whether the sandbox serves the code interpreter (port 49999).
    pub(crate) code_interpreter: bool,
    pub(crate) contexts: parking_lot::Mutex<crate::interpreter::Contexts>,
    pub(crate) watchers: parking_lot::Mutex<crate::watch::Watchers>,
    pub(crate) metadata: BTreeMap<String, String>,
    /// The template's variables, then the create request's.
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) started_at: SystemTime,
    pub(crate) end_at: parking_lot::Mutex<SystemTime>,
    pub(crate) paused: AtomicBool,
    /// Cancelled when the sandbox is killed or forgotten: its streams then end as
    /// E2B's do when the sandbox goes, `unavailable`, not with their process's end.
    pub(crate) gone: tokio_util::sync::CancellationToken,
    pub(crate) home: String,
    pub(crate) cpu_count: u32,
    pub(crate) memory_mb: u64,
    /// Its use of CPU, memory and disk over the last hour.
    pub(crate) metrics: parking_lot::Mutex<crate::metrics::Metrics>,
}

impl Sbx {
    /// Whether `presented` is this sandbox's token (in constant time).
    pub(crate) fn token_matches(&self, presented: &str) -> bool {
        self.token.as_bytes().ct_eq(presented.as_bytes()).into()
    }

    /// Whether `presented` is this sandbox's traffic token (in constant time).
    pub(crate) fn traffic_token_matches(&self, presented: &str) -> bool {
        self.traffic_token
            .as_ref()
            .is_some_and(|t| t.as_bytes().ct_eq(presented.as_bytes()).into())
    }

    /// A path of an E2B request in the sandbox: relative ones resolve against the
    /// home, `~` is the home.
    pub(crate) fn path(&self, p: &str) -> String {
        if p.is_empty() || p == "~" {
            self.home.clone()
        } else if let Some(rest) = p.strip_prefix("~/") {
            format!("{}/{rest}", self.home)
        } else if p.starts_with('/') {
            p.to_string()
        } else {
            format!("{}/{p}", self.home)
        }
    }
}

/// What the API shares between requests.
pub(crate) struct Inner {
    pub(crate) paddock: Paddock,
    pub(crate) config: E2bConfig,
    pub(crate) keys: Vec<ApiKey>,
    /// The largest upload of one file (`server.max_file_bytes`).
    pub(crate) max_file_bytes: u64,
    /// The largest body forwarded to a sandbox's own port (`server.max_body_bytes`).
    pub(crate) max_body_bytes: usize,
    /// How long a closing connection waits for its client (`server.close_linger_ms`).
    pub(crate) close_linger: std::time::Duration,
    pub(crate) templates: BTreeMap<String, TemplateConfig>,
    pub(crate) sandboxes: DashMap<String, Arc<Sbx>>,
    /// Sandboxes being opened, counted against `e2b.max_sandboxes` with the open.
    pub(crate) opening: std::sync::atomic::AtomicUsize,
}

impl Inner {
    pub(crate) fn new(
        paddock: Paddock,
        config: E2bConfig,
        server: &paddock_pool::http::ServerConfig,
        templates: BTreeMap<String, TemplateConfig>,
    ) -> Inner {
        Inner {
            paddock,
            config,
            keys: server.api_keys.clone(),
            max_file_bytes: server.max_file_bytes as u64,
            max_body_bytes: server.max_body_bytes,
            close_linger: std::time::Duration::from_millis(server.close_linger_ms),
            templates,
            sandboxes: DashMap::new(),
            opening: Default::default(),
        }
    }

    /// The caller a request's key names (`X-API-Key`, or a bearer: the one reader of
    /// credentials every surface uses), `None` for a wrong or missing key. Without
    /// configured keys, the tenant `X-Paddock-Tenant` claims, or none.
    pub(crate) fn caller(&self, headers: &actix_web::http::header::HeaderMap) -> Option<Caller> {
        paddock_pool::http::caller_of(&self.keys, headers).ok()
    }

    /// The sandbox `id` if `caller` may see it: another tenant's is `None`, as one
    /// that does not exist.
    pub(crate) fn visible(&self, caller: &Caller, id: &str) -> Option<Arc<Sbx>> {
        let s = self.sandboxes.get(id)?.clone();
        // Past its lifetime, it is gone, whether or not the reaper has ended it yet.
        let live = *s.end_at.lock() > SystemTime::now();
        (live && caller.sees(tenant_of(&s.caller))).then_some(s)
    }

    /// Forgets and destroys sandbox `id`; `false` if it was not open.
    pub(crate) async fn end(&self, id: &str) -> bool {
        let Some((_, s)) = self.sandboxes.remove(id) else {
            return false;
        };
        s.gone.cancel();
        crate::interpreter::forget_all(&s);
        if let Err(e) = s.handle.destroy().await {
            tracing::warn!(sandbox = %id, error = %e, "destroying an E2B sandbox failed");
        }
        true
    }

    /// Ends every sandbox, a few at a time.
    pub(crate) async fn close_all(&self) {
        let ids: Vec<String> = self.sandboxes.iter().map(|e| e.key().clone()).collect();
        self.end_all(ids).await;
    }

    /// Ends sandboxes `ids`, at most [`ENDING_AT_ONCE`] at a time.
    async fn end_all(&self, ids: Vec<String>) {
        use futures_util::StreamExt;
        futures_util::stream::iter(ids)
            .for_each_concurrent(ENDING_AT_ONCE, |id| async move {
                self.end(&id).await;
            })
            .await;
    }

    /// Forgets sandbox `id` whose Paddock session is gone already (destroyed through
    /// the native API, or by the pool's own limits).
    fn forget(&self, id: &str) {
        if let Some((_, s)) = self.sandboxes.remove(id) {
            s.gone.cancel();
            crate::interpreter::forget_all(&s);
        }
    }

    /// The lifetime a request asks for, bounded by `e2b.max_timeout_s`.
    pub(crate) fn lifetime(&self, timeout_s: Option<u64>) -> Duration {
        let s = timeout_s
            .unwrap_or(self.config.default_timeout_s)
            .clamp(1, self.config.max_timeout_s);
        Duration::from_secs(s)
    }

    /// When a lifetime from now ends (`e2b.max_timeout_s` is bounded, so this
    /// cannot overflow).
    pub(crate) fn ends(&self, timeout_s: Option<u64>) -> SystemTime {
        let now = SystemTime::now();
        now.checked_add(self.lifetime(timeout_s)).unwrap_or(now)
    }
}

/// The tenant a caller acts for, as sessions record it.
pub(crate) fn tenant_of(caller: &Caller) -> Option<&str> {
    match caller {
        Caller::Tenant(t) => t.as_deref(),
        Caller::Operator(t) => Some(t.as_str()),
        Caller::Embedder => None,
    }
}

/// Starts the task that ends sandboxes past their lifetime (a paused sandbox's
/// lifetime is `e2b.max_timeout_s` from its pause), and every [`PROBE_EVERY`] looks
/// at each session: one that is gone (destroyed through the native API, or by the
/// pool's own limits) is forgotten, and the look counts as a use of the others, so
/// that the pool's idle timeout does not end a sandbox E2B still holds alive.
pub(crate) fn spawn_reaper(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    tokio::spawn(async move {
        let mut last_probe = std::time::Instant::now();
        loop {
            tokio::time::sleep(REAP_EVERY).await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            let now = SystemTime::now();
            let due: Vec<String> = inner
                .sandboxes
                .iter()
                .filter(|e| *e.value().end_at.lock() <= now)
                .map(|e| e.key().clone())
                .collect();
            if !due.is_empty() {
                tracing::debug!(sandboxes = due.len(), "E2B sandboxes' lifetimes passed");
                inner.end_all(due).await;
            }
            if last_probe.elapsed() < PROBE_EVERY {
                continue;
            }
            last_probe = std::time::Instant::now();
            let all: Vec<Arc<Sbx>> = inner.sandboxes.iter().map(|e| e.value().clone()).collect();
            use futures_util::StreamExt;
            let gone: Vec<String> = futures_util::stream::iter(all)
                .map(|s| async move {
                    match s.handle.status().await {
                        Ok(paddock_core::SandboxStatus::Destroyed) => Some(s.id.clone()),
                        Err(e)
                            if matches!(
                                e.code,
                                paddock_core::ErrorCode::NotFound
                                    | paddock_core::ErrorCode::EngineDisposed
                            ) =>
                        {
                            Some(s.id.clone())
                        }
                        _ => None,
                    }
                })
                .buffer_unordered(ENDING_AT_ONCE)
                .filter_map(|g| async move { g })
                .collect()
                .await;
            for id in gone {
                tracing::debug!(sandbox = %id, "an E2B sandbox's session ended on its own");
                inner.forget(&id);
            }
        }
    });
}

/// A fresh access token: two UUIDv4s, 64 hex digits holding 244 random bits (from
/// the OS's random source), compared in constant time.
pub(crate) fn new_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}
