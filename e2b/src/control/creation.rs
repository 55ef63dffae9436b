//! `POST /sandboxes`: a new sandbox from a template, its network narrowed by what
//! the request asks, counted against `e2b.max_sandboxes` while it opens.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use paddock_core::{EngineName, Error, SandboxSpec};
use serde::Deserialize;

use super::{caller, created, parse, read_body, Answer, ApiError};
use crate::registry::{new_token, tenant_of, Inner, Sbx};

/// Most metadata entries of a sandbox, and bytes of each key and value.
const MAX_METADATA: usize = 64;
const MAX_METADATA_KEY: usize = 256;
const MAX_METADATA_VALUE: usize = 1024;
/// Most environment variables a create request may give.
const MAX_ENV_VARS: usize = 256;

/// `POST /sandboxes` and `/v2/sandboxes`. Fields Paddock has no use for
/// (`autoPause`, `mcp`, …) are accepted and ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    /// `false`: no internet (E2B: the same as `network.denyOut = ["0.0.0.0/0"]`).
    #[serde(default, rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    network: Option<NewNetwork>,
}

/// The `network` of a new sandbox: egress rules and who may reach its ports. (Its
/// other fields, such as `rules`, are accepted and ignored.)
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewNetwork {
    /// `true`: the sandbox's own ports (not 49983 or 49999) answer without a token.
    /// Otherwise (omitted too) they take its `trafficAccessToken` in
    /// `E2B-Traffic-Access-Token`.
    #[serde(default)]
    allow_public_traffic: Option<bool>,
    /// Destinations admitted even where `denyOut` denies them.
    #[serde(default)]
    allow_out: Option<Vec<String>>,
    /// Address ranges denied.
    #[serde(default)]
    deny_out: Option<Vec<String>>,
    /// The `Host` the sandbox's servers see on requests to its ports, `${PORT}`
    /// standing for the port (E2B's `maskRequestHost`); unset, the caller's own.
    #[serde(default)]
    mask_request_host: Option<String>,
}

/// The longest `maskRequestHost`.
const MAX_MASK: usize = 300;

/// A `maskRequestHost` that makes a `Host` for every port, or what is wrong with it.
fn check_mask(mask: &str) -> Result<(), ApiError> {
    let bad = |why: &str| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("network.maskRequestHost {mask:?}: {why}"),
        )
    };
    if mask.is_empty() || mask.len() > MAX_MASK {
        return Err(bad(&format!("give 1 to {MAX_MASK} characters")));
    }
    let host = mask.replace("${PORT}", "65535");
    let authority = host
        .parse::<actix_web::http::uri::Authority>()
        .map_err(|_| bad("not a host name (with a port) once ${PORT} is put in"))?;
    if authority.as_str().contains('@') {
        return Err(bad("a host carries no user"));
    }
    Ok(())
}

/// Whether a `denyOut` entry denies every address.
fn denies_all(entry: &str) -> bool {
    matches!(entry.trim(), "0.0.0.0/0" | "::/0")
}

/// The template's network policy, narrowed by what the request asks: E2B's
/// egress rules are a denylist (`denyOut`) with exceptions (`allowOut`). Paddock
/// enforces allowlists, so a request that denies everything becomes an allowlist
/// of its `allowOut` (or `none`) inside the template's policy; one that denies
/// only some ranges is refused (it cannot be enforced as asked), unless the
/// template has no network to deny anyway. Nothing a request says widens the
/// template's policy.
fn requested_network(
    template: &paddock_core::NetworkPolicy,
    allow_internet_access: Option<bool>,
    network: Option<&NewNetwork>,
) -> Result<paddock_core::NetworkPolicy, ApiError> {
    let (allow, deny) = match network {
        Some(n) => (
            n.allow_out.clone().unwrap_or_default(),
            n.deny_out.clone().unwrap_or_default(),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let deny_all = allow_internet_access == Some(false) || deny.iter().any(|d| denies_all(d));
    if !deny_all {
        if !deny.is_empty() && *template != paddock_core::NetworkPolicy::None {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "network.denyOut denies only some ranges, which Paddock cannot enforce (it admits by allowlist): deny everything with \"0.0.0.0/0\" and list what may be reached in network.allowOut",
            ));
        }
        return Ok(template.clone());
    }
    template
        .narrowed_to(&allow, "network.allowOut")
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.message))
}

pub(crate) async fn create(
    inner: web::Data<Arc<Inner>>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let run = async {
        // The key first: the body of a request without one is never read.
        caller(&inner, &req)?;
        let body = read_body(payload).await?;
        create_inner(&inner, &req, &body).await
    };
    run.await.unwrap_or_else(|e: ApiError| e.response())
}

async fn create_inner(inner: &Arc<Inner>, req: &HttpRequest, body: &[u8]) -> Answer {
    let caller = caller(inner, req)?;
    let new: NewSandbox = parse(body)?;
    let template_id = new
        .template_id
        .unwrap_or_else(|| crate::BASE_TEMPLATE.to_string());
    crate::check_template_name(&template_id)?;
    // `team/name:tag` and `name:tag` name the template `name`.
    let name = template_id
        .rsplit('/')
        .next()
        .unwrap_or(&template_id)
        .split(':')
        .next()
        .unwrap_or_default();
    let template = inner.templates.get(name).cloned().ok_or_else(|| {
        let mut known: Vec<&str> = inner.templates.keys().map(String::as_str).collect();
        known.sort_unstable();
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "template \"{template_id}\" is not configured here; configured: {}",
                known.join(", ")
            ),
        )
    })?;
    let network = requested_network(
        &template.network,
        new.allow_internet_access,
        new.network.as_ref(),
    )?;
    let ingress =
        crate::access::Ingress::asked(new.network.as_ref().and_then(|n| n.allow_public_traffic));
    let mask_host = new
        .network
        .as_ref()
        .and_then(|n| n.mask_request_host.clone());
    if let Some(mask) = &mask_host {
        check_mask(mask)?;
    }
    let metadata = new.metadata.unwrap_or_default();
    check_metadata(&metadata)?;
    let env_vars = new.env_vars.unwrap_or_default();
    if env_vars.len() > MAX_ENV_VARS {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{} envVars; at most {MAX_ENV_VARS}", env_vars.len()),
        ));
    }
    let mut env = template.env.clone();
    env.extend(env_vars);
    // Checked as a process's variables are, before anything is opened.
    paddock_core::ProcessSpec {
        argv: vec!["true".into()],
        env: env.clone(),
        ..Default::default()
    }
    .validate()
    .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("envVars: {}", e.message)))?;

    // The cap counts sandboxes open and being opened.
    let held = inner.opening.fetch_add(1, Ordering::AcqRel) + 1;
    let _opening = Opening(inner.clone());
    if let Some(max) = inner
        .config
        .max_sandboxes
        .filter(|max| held + inner.sandboxes.len() > *max)
    {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("e2b.max_sandboxes ({max}) sandboxes are open; kill one or retry later"),
        ));
    }
    let engine = match &template.engine {
        Some(e) => e.clone(),
        None => default_engine(inner, name)?,
    };
    let spec = SandboxSpec {
        level: template.level,
        network,
        limits: template.limits.clone(),
        tenant: tenant_of(&caller).map(String::from),
        home: Some(template.home.clone()),
    };
    // Opened and recorded in a task of its own: a request cancelled midway (a
    // client that gave up on a slow start) leaves no session E2B does not know of;
    // the sandbox is then ended at its lifetime's end, like an abandoned one.
    let task_inner = inner.clone();
    let timeout = new.timeout;
    let opened = actix_web::rt::spawn(async move {
        let inner = task_inner;
        let _opening = _opening;
        let handle = inner.paddock.open_sandbox(spec, Some(engine)).await?;
        let id = handle.id().to_string();
        let sbx = Arc::new(Sbx {
            id: id.clone(),
            template: template_id,
            caller,
            handle,
            token: new_token(),
            traffic_token: ingress
                .needs_traffic_token(template.code_interpreter)
                .then(new_token),
            ingress,
            mask_host,
            code_interpreter: template.code_interpreter,
            contexts: Default::default(),
            watchers: Default::default(),
            metadata,
            env,
            started_at: SystemTime::now(),
            end_at: parking_lot::Mutex::new(inner.ends(timeout)),
            paused: Default::default(),
            gone: Default::default(),
            home: template.home.clone(),
            cpu_count: template
                .limits
                .cpu_millicores
                .map_or(1, |m| m.div_ceil(1000).max(1) as u32),
            memory_mb: template.limits.memory_bytes.map_or(0, |b| b >> 20),
            metrics: Default::default(),
        });
        inner.sandboxes.insert(id, sbx.clone());
        crate::metrics::start_sampling(&sbx);
        Ok::<_, Error>(sbx)
    });
    let sbx = opened.await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("opening the sandbox failed: {e}"),
        )
    })??;
    Ok(HttpResponse::Created().json(created(inner, &sbx, req)))
}

/// Releases a place of `e2b.max_sandboxes` taken while a sandbox opens.
struct Opening(Arc<Inner>);

impl Drop for Opening {
    fn drop(&mut self) {
        self.0.opening.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The engine of a template that names none: the container engine when it runs
/// here; the subprocess engine when the configuration disables containers; and when
/// the container engine is enabled but cannot run on this host,
/// `CAPABILITY_NOT_SUPPORTED` with why: a template never silently runs on a weaker
/// engine than it would get on a host where containers work.
pub(crate) fn default_engine(inner: &Inner, template: &str) -> Result<EngineName, Error> {
    let homes = |name: &EngineName| {
        inner
            .paddock
            .capabilities()
            .iter()
            .any(|(n, c)| n == name && c.has_feature(paddock_core::engine::FEATURE_HOME))
    };
    if homes(&EngineName::CONTAINER) {
        return Ok(EngineName::CONTAINER);
    }
    if let Some((_, why)) = inner
        .paddock
        .unavailable_engines()
        .iter()
        .find(|(n, _)| *n == EngineName::CONTAINER)
    {
        return Err(Error::new(
            paddock_core::ErrorCode::CapabilityNotSupported,
            format!(
                "template `{template}` runs on the container engine, and {why}; the server's operator can run `paddock doctor`, or set templates.{template}.engine"
            ),
        ));
    }
    Ok(EngineName::SUBPROCESS)
}

fn check_metadata(m: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if m.len() > MAX_METADATA {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{} metadata entries; at most {MAX_METADATA}", m.len()),
        ));
    }
    for (k, v) in m {
        if k.is_empty() || k.len() > MAX_METADATA_KEY || v.len() > MAX_METADATA_VALUE {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "metadata {k:?}: keys are 1-{MAX_METADATA_KEY} bytes, values at most {MAX_METADATA_VALUE}"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::NetworkPolicy;

    fn body(json: &str) -> NewSandbox {
        parse(json.as_bytes()).expect("a body")
    }

    fn network(template: &NetworkPolicy, json: &str) -> Result<NetworkPolicy, ApiError> {
        let new = body(json);
        requested_network(template, new.allow_internet_access, new.network.as_ref())
    }

    #[test]
    fn a_request_narrows_the_templates_network_and_never_widens_it() {
        let open = NetworkPolicy::Unrestricted;
        let listed = NetworkPolicy::Allowlist {
            hosts: vec!["*.example.org".into()],
            ports: vec![443],
        };
        // Nothing asked, or internet allowed: the template's policy.
        for t in [&open, &listed, &NetworkPolicy::None] {
            assert_eq!(&network(t, "{}").unwrap(), t);
            assert_eq!(
                &network(t, r#"{"allow_internet_access": true}"#).unwrap(),
                t
            );
            // allowOut alone grants nothing beyond the template.
            assert_eq!(
                &network(t, r#"{"network": {"allowOut": ["evil.test"]}}"#).unwrap(),
                t
            );
        }
        // No internet: none, whatever the template.
        for t in [&open, &listed] {
            assert_eq!(
                network(t, r#"{"allow_internet_access": false}"#).unwrap(),
                NetworkPolicy::None
            );
            assert_eq!(
                network(t, r#"{"network": {"denyOut": ["0.0.0.0/0"]}}"#).unwrap(),
                NetworkPolicy::None
            );
        }
        // Deny all but some: an allowlist inside the template's.
        let some = r#"{"network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["api.example.org", "evil.test"]}}"#;
        assert_eq!(
            network(&open, some).unwrap(),
            NetworkPolicy::Allowlist {
                hosts: vec!["api.example.org".into(), "evil.test".into()],
                ports: vec![],
            }
        );
        // An exception beyond the template's allowlist is refused, not dropped.
        let e = network(&listed, some).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(
            e.message.contains("network.allowOut[1]") && e.message.contains("evil.test"),
            "{}",
            e.message
        );
        let inside = r#"{"network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["api.example.org"]}}"#;
        assert_eq!(
            network(&listed, inside).unwrap(),
            NetworkPolicy::Allowlist {
                hosts: vec!["api.example.org".into()],
                ports: vec![443],
            }
        );
        assert_eq!(
            network(
                &open,
                r#"{"allow_internet_access": false, "network": {"allowOut": ["pypi.org"]}}"#
            )
            .unwrap(),
            NetworkPolicy::Allowlist {
                hosts: vec!["pypi.org".into()],
                ports: vec![],
            }
        );
        // A template without network grants no exception: refused, not `none`.
        let e = network(&NetworkPolicy::None, some).unwrap_err();
        assert!(e.message.contains("no network"), "{}", e.message);
        assert_eq!(
            network(
                &NetworkPolicy::None,
                r#"{"network": {"denyOut": ["0.0.0.0/0"]}}"#
            )
            .unwrap(),
            NetworkPolicy::None
        );
    }

    #[test]
    fn a_partial_deny_list_or_a_bad_entry_is_refused_with_what_to_send() {
        let e = network(
            &NetworkPolicy::Unrestricted,
            r#"{"network": {"denyOut": ["10.0.0.0/8"]}}"#,
        )
        .unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("0.0.0.0/0"), "{}", e.message);
        // Nothing to deny in a sandbox without network: accepted as it is.
        assert_eq!(
            network(
                &NetworkPolicy::None,
                r#"{"network": {"denyOut": ["10.0.0.0/8"]}}"#
            )
            .unwrap(),
            NetworkPolicy::None
        );
        let e = network(
            &NetworkPolicy::Unrestricted,
            r#"{"network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["not a host"]}}"#,
        )
        .unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("network.allowOut"), "{}", e.message);
        // A malformed network is a malformed body.
        assert!(parse::<NewSandbox>(br#"{"network": {"allowOut": "x"}}"#).is_err());
    }
}
