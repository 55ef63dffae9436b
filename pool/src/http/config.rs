//! The HTTP server's settings (`[server]`): listeners, TLS, API keys and `/metrics`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use paddock_core::error::{Error, Result};
use paddock_core::isolation::IsolationLevel;
use paddock_core::tenancy::{AccessRules, Allowed, NetworkKind};

/// Settings of the HTTP server (`paddock serve`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on. Default `127.0.0.1:7878`; port 0 picks a free port.
    pub listen: String,
    /// API keys and the tenant each one stands for. Empty (the default) turns
    /// authentication off; the tenant then comes from the `X-Paddock-Tenant` header.
    pub api_keys: Vec<ApiKey>,
    /// Isolation levels every tenant may use, unless its key says otherwise.
    /// Default: every level without API keys; every level but `none` with them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_levels: Option<Vec<IsolationLevel>>,
    /// Network policies every tenant may ask for, unless its key says otherwise.
    /// Default: every policy without API keys; every policy but `unrestricted` with
    /// them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_networks: Option<Vec<NetworkKind>>,
    /// Largest JSON request body, in bytes. Default 1 MiB.
    pub max_body_bytes: usize,
    /// Largest file upload, in bytes. Default 64 MiB.
    pub max_file_bytes: usize,
    /// How long finished results stay available by id and idempotency key, in
    /// seconds. Default 600.
    pub result_retention_s: u64,
    /// Most results kept at once. Default 10000.
    pub max_results: usize,
    /// Bytes of kept results (output, values, messages) for all tenants together;
    /// the oldest are dropped first. Default 256 MiB.
    pub max_result_bytes: u64,
    /// Bytes of kept results per tenant; a tenant over it loses its own oldest
    /// results, never another tenant's. A single result larger than this is kept
    /// without its output (a warning says so). Default 64 MiB.
    pub max_result_bytes_per_tenant: u64,
    /// Requests a tenant may have in progress at once, streamed responses and open
    /// WebSockets included; more are answered 429 `RATE_LIMITED`. Default 256.
    pub max_requests_per_tenant: u32,
    /// WebSockets (attach, TCP) a tenant may have open at once; more are answered
    /// 429 `RATE_LIMITED`. Default 64.
    pub max_websockets_per_tenant: u32,
    /// How long a connection the server is closing waits for its client before it is
    /// dropped, in milliseconds. Default 100. A WebSocket the server closes ends this
    /// long after its close frame at most (usually at once). An answer given before a
    /// request's body was read (a 413 for an upload over the limit, a 401) is
    /// followed by this long a wait while the client may still be sending; a client
    /// that sends past it may see a reset instead of the answer, so raise it for
    /// clients that upload large files slowly and do not send `Expect: 100-continue`.
    /// At most 60000.
    pub close_linger_ms: u64,
    /// How long a new connection has to send its first request's head (request line
    /// and headers), in milliseconds; past it the server answers 408 and closes the
    /// connection. Default 5000; 1 to 600000. (Later requests on a kept-alive
    /// connection are bounded by the keep-alive timer until their first byte, and, on
    /// a connection that has presented no credential, by
    /// `max_unauthenticated_connections`.)
    pub header_read_timeout_ms: u64,
    /// How long a request body may go without a byte arriving while the server reads
    /// it, in milliseconds; past it the request is answered 408 `TIMEOUT` and its
    /// connection closed. Default 30000; 1 to 3600000. WebSockets and E2B Connect
    /// client streams (`process.Process/StreamInput`) are long-lived by design and
    /// not bounded by it.
    pub body_read_timeout_ms: u64,
    /// Connections that have not yet presented a valid credential (an API key, or a
    /// sandbox's access token; without API keys, any request), across all clients;
    /// past it the oldest such connection is closed to make room. Default 4096.
    pub max_unauthenticated_connections: u32,
    /// Connections without a valid credential from one client address (one IPv6
    /// /64); past it that address's oldest such connection is closed. Default 256; at
    /// most `max_unauthenticated_connections`.
    pub max_unauthenticated_connections_per_address: u32,
    /// Where `/metrics` is served: `"api"` (the default) on the API's address to
    /// anyone, `"operator"` on the API's address to operator keys only, or an
    /// `ADDR:PORT` of its own (then not on the API's address at all).
    pub metrics: String,
    /// How long a graceful shutdown lets running executions finish, in ms. Default 10000.
    pub drain_ms: u64,
    /// Refuse to start when an enabled engine cannot run on this host (a container
    /// engine without a usable OCI runtime, say), instead of serving without it.
    /// Default `false`: the server starts, says which engine is missing and why,
    /// and refuses requests and templates that need it (never running them on a
    /// weaker engine).
    pub require_engines: bool,
    /// HTTP worker threads. Default 2.
    pub workers: usize,
    /// A second listener that serves the same routes over TLS (`[server.tls]`), for
    /// clients that reach the server by `https://` names: E2B's SDKs with
    /// `E2B_DOMAIN`, say. Default: none (only `listen`, plain HTTP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

/// The TLS listener of the server (`[server.tls]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Address to listen on, such as `0.0.0.0:443`; port 0 picks a free port.
    pub listen: String,
    /// The certificate chain, PEM, the server's own certificate first (a
    /// `fullchain.pem`). For the E2B domain mode it must name `api.DOMAIN` and
    /// `*.DOMAIN` (a wildcard certificate).
    pub cert: PathBuf,
    /// The certificate's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// An API key and its tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    /// The bearer token.
    pub key: String,
    /// The tenant requests with this key are accounted to.
    pub tenant: String,
    /// An operator key: it sees and may cancel every tenant's executions, audit and
    /// statistics (each such use is itself recorded). Default `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
    /// Isolation levels this key's tenant may use; default the server's
    /// `allowed_levels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_levels: Option<Vec<IsolationLevel>>,
    /// Network policies this key's tenant may ask for; default the server's
    /// `allowed_networks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_networks: Option<Vec<NetworkKind>>,
    /// Whether this key's allowlists may name private and shared address ranges;
    /// default `[egress] allow_private`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_private: Option<bool>,
}

impl ApiKey {
    /// A plain (non-operator) key with the server's allowances.
    pub fn new(key: impl Into<String>, tenant: impl Into<String>) -> ApiKey {
        ApiKey {
            key: key.into(),
            tenant: tenant.into(),
            admin: false,
            allowed_levels: None,
            allowed_networks: None,
            allow_private: None,
        }
    }
}

/// Where `/metrics` is served, from [`ServerConfig::metrics`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAccess {
    /// On the API's address, to anyone.
    Open,
    /// On the API's address, to operator keys only.
    Operator,
    /// On an address of its own, and not on the API's.
    Listen(std::net::SocketAddr),
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:7878".into(),
            api_keys: Vec::new(),
            allowed_levels: None,
            allowed_networks: None,
            max_body_bytes: 1 << 20,
            max_file_bytes: 64 << 20,
            result_retention_s: 600,
            max_results: 10_000,
            max_result_bytes: 256 << 20,
            max_result_bytes_per_tenant: 64 << 20,
            max_requests_per_tenant: 256,
            max_websockets_per_tenant: 64,
            close_linger_ms: 100,
            header_read_timeout_ms: 5_000,
            body_read_timeout_ms: 30_000,
            max_unauthenticated_connections: 4096,
            max_unauthenticated_connections_per_address: 256,
            metrics: "api".into(),
            drain_ms: 10_000,
            require_engines: false,
            workers: 2,
            tls: None,
        }
    }
}

impl ServerConfig {
    /// What each tenant may use: the server's `allowed_*` (or, when unset, everything
    /// without API keys and [`Allowed::multi_tenant_default`] with them), overridden
    /// per key.
    pub fn access_rules(&self) -> AccessRules {
        let base = if self.api_keys.is_empty() {
            Allowed::all()
        } else {
            Allowed::multi_tenant_default()
        };
        let default = Allowed {
            levels: self.allowed_levels.clone(),
            networks: self.allowed_networks.clone(),
            private: None,
        }
        .or(&base);
        let tenants = self
            .api_keys
            .iter()
            .filter(|k| {
                k.allowed_levels.is_some()
                    || k.allowed_networks.is_some()
                    || k.allow_private.is_some()
            })
            .map(|k| {
                (
                    k.tenant.clone(),
                    Allowed {
                        levels: k.allowed_levels.clone(),
                        networks: k.allowed_networks.clone(),
                        private: k.allow_private,
                    },
                )
            })
            .collect();
        AccessRules { default, tenants }
    }

    /// Where `/metrics` is served (`server.metrics` checked).
    pub fn metrics_access(&self) -> Result<MetricsAccess> {
        match self.metrics.as_str() {
            "api" => Ok(MetricsAccess::Open),
            "operator" => Ok(MetricsAccess::Operator),
            other => other.parse().map(MetricsAccess::Listen).map_err(|_| {
                Error::invalid_config(
                    "server.metrics",
                    format!(
                        "`{other}` is not `api`, `operator` or an ADDR:PORT such as 127.0.0.1:9464"
                    ),
                )
            }),
        }
    }

    /// Checks the values; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(Error::invalid_config(
                "server.listen",
                format!(
                    "`{}` is not ADDR:PORT (for example 127.0.0.1:7878)",
                    self.listen
                ),
            ));
        }
        if let Some(tls) = &self.tls {
            let Ok(at) = tls.listen.parse::<std::net::SocketAddr>() else {
                return Err(Error::invalid_config(
                    "server.tls.listen",
                    format!(
                        "`{}` is not ADDR:PORT (for example 0.0.0.0:443)",
                        tls.listen
                    ),
                ));
            };
            if at.port() != 0 && self.listen.parse::<std::net::SocketAddr>().ok() == Some(at) {
                return Err(Error::invalid_config(
                    "server.tls.listen",
                    "is server.listen's address; give the TLS listener another port",
                ));
            }
            for (field, path) in [("server.tls.cert", &tls.cert), ("server.tls.key", &tls.key)] {
                if !path.is_absolute() {
                    return Err(Error::invalid_config(
                        field,
                        format!("`{}` must be an absolute path", path.display()),
                    ));
                }
            }
        }
        let mut tenants_of_keys: BTreeMap<&str, (usize, bool)> = BTreeMap::new();
        for (i, k) in self.api_keys.iter().enumerate() {
            if k.key.len() < 16 {
                return Err(Error::invalid_config(
                    &format!("server.api_keys[{i}].key"),
                    "must be at least 16 characters",
                ));
            }
            if k.tenant.is_empty() || k.tenant.len() > 256 {
                return Err(Error::invalid_config(
                    &format!("server.api_keys[{i}].tenant"),
                    "must be 1 to 256 characters",
                ));
            }
            let has_rules = k.allowed_levels.is_some() || k.allowed_networks.is_some();
            if let Some((first, first_rules)) = tenants_of_keys.insert(&k.tenant, (i, has_rules)) {
                if first_rules || has_rules {
                    return Err(Error::invalid_config(
                        &format!("server.api_keys[{i}]"),
                        format!(
                            "tenant `{}` also has key {first}: give allowed_levels / allowed_networks on one key per tenant only",
                            k.tenant
                        ),
                    ));
                }
            }
        }
        if self.metrics_access()? == MetricsAccess::Operator
            && !self.api_keys.iter().any(|k| k.admin)
        {
            return Err(Error::invalid_config(
                "server.metrics",
                "`operator` serves /metrics to operator keys only, and no key has `admin = true`; add one, or use `api` or an ADDR:PORT",
            ));
        }
        for (name, v) in [
            ("server.max_body_bytes", self.max_body_bytes),
            ("server.max_file_bytes", self.max_file_bytes),
            ("server.max_results", self.max_results),
            (
                "server.max_requests_per_tenant",
                self.max_requests_per_tenant as usize,
            ),
            (
                "server.max_websockets_per_tenant",
                self.max_websockets_per_tenant as usize,
            ),
            ("server.workers", self.workers),
            (
                "server.max_unauthenticated_connections",
                self.max_unauthenticated_connections as usize,
            ),
            (
                "server.max_unauthenticated_connections_per_address",
                self.max_unauthenticated_connections_per_address as usize,
            ),
        ] {
            if v == 0 {
                return Err(Error::invalid_config(name, "must be greater than 0"));
            }
        }
        if self.close_linger_ms > 60_000 {
            return Err(Error::invalid_config(
                "server.close_linger_ms",
                format!(
                    "{} ms is too long: at most 60000 (a minute)",
                    self.close_linger_ms
                ),
            ));
        }
        for (name, v, max) in [
            (
                "server.header_read_timeout_ms",
                self.header_read_timeout_ms,
                600_000,
            ),
            (
                "server.body_read_timeout_ms",
                self.body_read_timeout_ms,
                3_600_000,
            ),
        ] {
            if v == 0 || v > max {
                return Err(Error::invalid_config(
                    name,
                    format!("{v} ms: give 1 to {max} ms"),
                ));
            }
        }
        if self.max_unauthenticated_connections_per_address > self.max_unauthenticated_connections {
            return Err(Error::invalid_config(
                "server.max_unauthenticated_connections_per_address",
                format!(
                    "must be at most server.max_unauthenticated_connections ({})",
                    self.max_unauthenticated_connections
                ),
            ));
        }
        if self.workers > 64 {
            return Err(Error::invalid_config(
                "server.workers",
                "must be at most 64",
            ));
        }
        if self.max_result_bytes_per_tenant == 0
            || self.max_result_bytes_per_tenant > self.max_result_bytes
        {
            return Err(Error::invalid_config(
                "server.max_result_bytes_per_tenant",
                format!(
                    "must be in 1..=server.max_result_bytes ({})",
                    self.max_result_bytes
                ),
            ));
        }
        Ok(())
    }
}
