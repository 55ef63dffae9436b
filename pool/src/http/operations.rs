//! Operations: the audit log, statistics, metrics, health, readiness, the OpenAPI
//! document.

use std::sync::atomic::Ordering;

use actix_web::{web, HttpRequest, HttpResponse};
use paddock_core::{EngineName, Error, ErrorCode};
use serde::Deserialize;

use super::MetricsAccess;
use super::answers::{Health, Liveness, Readiness, ReadyState, ResultBytes, StatsAnswer};
use super::tenancy::account;
use super::*;
use crate::audit::AuditQuery;
use crate::Caller;

/// The query of `GET /v1/audit`; every filter is optional.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AuditParams {
    /// Only successes (`true`: completed with exit code 0) or only the rest (`false`).
    pub(super) success: Option<bool>,
    /// Only this tenant (a tenant's key sees its own entries whatever this says).
    pub(super) tenant: Option<String>,
    /// Only this engine (one the server runs).
    pub(super) engine: Option<EngineName>,
    /// Only entries at or after this time (RFC 3339, inclusive).
    #[schemars(extend("format" = "date-time"))]
    pub(super) after: Option<String>,
    /// Only entries before this time (RFC 3339, exclusive).
    #[schemars(extend("format" = "date-time"))]
    pub(super) before: Option<String>,
    /// At most this many entries (newest first).
    pub(super) limit: Option<usize>,
}

pub(super) async fn audit(
    state: Shared,
    caller: Caller,
    q: web::Query<AuditParams>,
) -> Result<HttpResponse, ApiError> {
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
    if let Some(engine) = &q.engine {
        let runs = state.paddock.engines();
        if !runs.contains(engine) {
            let runs: Vec<&str> = runs.iter().map(EngineName::as_str).collect();
            return Err(Error::invalid_options(
                "query",
                format!(
                    "`engine={engine}` names no engine this server runs; it runs: {}",
                    runs.join(", ")
                ),
            )
            .into());
        }
    }
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

/// `GET /v1/fleet`: the nodes, with their room and health. A tenant sees the same
/// list without the nodes' addresses.
pub(super) async fn fleet(state: Shared, caller: Caller) -> Result<HttpResponse, ApiError> {
    let Some(fleet) = state.paddock.federation() else {
        return Err(Error::new(
            ErrorCode::NotFound,
            "this server is not part of a fleet; start it with `paddock serve --fleet nats://HOST:PORT`",
        )
        .into());
    };
    let nodes = fleet.nodes(&caller).await?;
    let node = nodes
        .iter()
        .find(|n| n.this_node)
        .map(|n| n.id.clone())
        .unwrap_or_default();
    Ok(HttpResponse::Ok().json(super::answers::FleetAnswer { node, nodes }))
}

/// The query of `GET /v1/audit/operator`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitParam {
    /// At most this many records (newest first).
    pub(super) limit: Option<usize>,
}

pub(super) async fn operator_accesses(
    state: Shared,
    caller: Caller,
    q: web::Query<LimitParam>,
) -> Result<HttpResponse, ApiError> {
    let limit = q.limit.unwrap_or(crate::audit::DEFAULT_SEARCH_LIMIT);
    // Without API keys there are no operators: nobody gets the record.
    let caller = match caller {
        Caller::Operator(_) => caller,
        _ => Caller::tenant(""),
    };
    let accesses = state.paddock.operator_accesses(&caller, limit).await?;
    Ok(HttpResponse::Ok().json(accesses))
}

/// `GET /v1/engines`: the engines this server runs, what each can do, and whether the
/// caller may use it. The same for every tenant but `usable`, which follows the
/// caller's allowed levels.
pub(super) async fn engines(state: Shared, caller: Caller) -> Result<HttpResponse, ApiError> {
    let allowed = state
        .paddock
        .access_rules()
        .for_tenant(caller.confined_to().flatten());
    let engines = state
        .paddock
        .capabilities()
        .iter()
        .map(|(name, caps)| super::answers::EngineEntry {
            name: name.clone(),
            max_level: caps.max_level,
            programs: caps.programs.clone(),
            network: caps.network.clone(),
            features: caps.features.clone(),
            capabilities: known_capabilities(caps, state.paddock.prewarms()),
            limits: caps.limits.clone(),
            usable: allowed.allows_level(caps.max_level),
        })
        .collect();
    Ok(HttpResponse::Ok().json(super::answers::EnginesAnswer { engines }))
}

/// An engine's capabilities by the names agent frameworks share.
fn known_capabilities(
    caps: &paddock_core::Capabilities,
    prewarms: bool,
) -> std::collections::BTreeSet<String> {
    use paddock_core::IsolationLevel;
    let mut out = std::collections::BTreeSet::new();
    let mut add = |yes: bool, name: &str| {
        if yes {
            out.insert(name.to_string());
        }
    };
    add(caps.has_feature("streaming"), "streaming");
    add(prewarms, "warm-pool");
    add(caps.max_level == IsolationLevel::Strict, "strict");
    add(
        caps.max_level >= IsolationLevel::ContextIsolated,
        "context-isolated",
    );
    add(caps.network.contains("allowlist"), "network-allowlist");
    add(
        caps.network.contains("unrestricted"),
        "network-unrestricted",
    );
    out
}

pub(super) async fn stats(state: Shared, caller: Caller) -> Result<HttpResponse, ApiError> {
    let stats = state.paddock.stats_for(&caller).await?;
    let audit = state.paddock.audit_statistics(&caller).await?;
    let (total, own) = state.results.bytes(account(&caller).as_deref());
    let results = match caller.confined_to() {
        Some(_) => ResultBytes {
            bytes: own,
            max_bytes: state.config.max_result_bytes_per_tenant,
        },
        None => ResultBytes {
            bytes: total,
            max_bytes: state.config.max_result_bytes,
        },
    };
    Ok(HttpResponse::Ok().json(StatsAnswer {
        scheduler: stats,
        audit,
        results,
    }))
}

/// `/metrics` on the API's address: open, for operator keys only, or not here at all
/// (`server.metrics`). It carries no tenant names or ids.
pub(super) async fn metrics(state: Shared, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    match &state.metrics {
        MetricsAccess::Open => {}
        MetricsAccess::Operator => {
            if !super::tenancy::caller(&state.config, &req)?.is_operator() {
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

pub(super) async fn metrics_only(state: Shared) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(paddock_telemetry::PROMETHEUS_CONTENT_TYPE)
        .body(state.paddock.telemetry().render_prometheus())
}

pub(super) async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().json(openapi::document())
}

pub(super) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health {
        status: Liveness::Ok,
    })
}

pub(super) async fn readyz(state: Shared) -> HttpResponse {
    let answer = |status| Readiness { status };
    if state.draining.load(Ordering::Acquire) {
        return HttpResponse::ServiceUnavailable().json(answer(ReadyState::Draining));
    }
    match state.paddock.stats().await {
        Ok(s) if s.admitting => HttpResponse::Ok().json(answer(ReadyState::Ready)),
        _ => HttpResponse::ServiceUnavailable().json(answer(ReadyState::NotReady)),
    }
}
