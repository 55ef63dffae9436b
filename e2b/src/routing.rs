//! Which requests are E2B's, and where each goes.
//!
//! A request for a sandbox's own ports carries the `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers (one URL for everything, `E2B_SANDBOX_URL`), or a
//! `{port}-{sandboxID}.{domain}` host name (`E2B_DOMAIN`); it is routed by them,
//! whatever its path. Everything else with a control-plane path goes to the control
//! plane; the rest is left to the native API. Who may reach which port is decided in
//! [`crate::access`], for the routing and the per-tenant count alike.

use std::sync::Arc;

use actix_web::dev::RequestHead;
use actix_web::http::StatusCode;
use actix_web::{guard, web, HttpMessage, HttpRequest, HttpResponse};
use futures_util::StreamExt;

use crate::access::{parse_port, Access};
use crate::connect::{self, Code, ConnectError};
use crate::errors::proxy_error;
use crate::files::http_error;
use crate::registry::{Inner, Sbx};
use crate::table::{RpcKind, AGENT, FILESYSTEM, PROCESS};
use crate::{control, files, process, CODE_INTERPRETER_PORT, ENVD_PORT};

/// The sandbox and port a request addresses, if it is a sandbox request. The port
/// is parsed here, once, for the routing and the count alike: `None` when it is not
/// a port number as [`parse_port`] takes it (answered 400, and not counted).
pub(crate) fn target(head: &RequestHead, domain: Option<&str>) -> Option<(String, Option<u16>)> {
    let headers = &head.headers;
    if let Some(id) = headers.get("e2b-sandbox-id").and_then(|v| v.to_str().ok()) {
        let port = headers
            .get("e2b-sandbox-port")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_port);
        return Some((id.to_string(), port));
    }
    let host = headers.get("host").and_then(|v| v.to_str().ok())?;
    let label = match domain {
        Some(domain) => {
            let host = host.rsplit_once(':').map_or(host, |(h, p)| {
                if p.bytes().all(|b| b.is_ascii_digit()) {
                    h
                } else {
                    host
                }
            });
            host.strip_suffix(domain)?.strip_suffix('.')?
        }
        // In the URL mode, the names `url_mode_domain` hands out: the first label
        // of whatever name the client reached this server by.
        None => host.split_once('.').filter(|(_, rest)| !rest.is_empty())?.0,
    };
    let (port, id) = label.split_once('-')?;
    let id_ok = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && id_ok)
        .then(|| (id.to_string(), parse_port(port)))
}

/// The domain a sandbox's names are under when `e2b.domain` is unset (the URL
/// mode): the name the client reached this server by, so that the SDK's
/// `get_host(port)`, `{port}-{id}.{domain}`, names this server, which routes it by
/// its `Host` ([`target`]). A loopback address becomes `localhost` (`*.localhost`
/// is loopback by RFC 6761, and browsers and curl resolve it so); another address
/// or name stays as given, which a client reaches with that `Host` header.
pub(crate) fn url_mode_domain(req: &HttpRequest) -> Option<String> {
    let host = req.headers().get("host").and_then(|v| v.to_str().ok())?;
    let (name, port) = match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') => (h, Some(p)),
        _ => (host, None),
    };
    let loopback = name == "localhost"
        || name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let name = if loopback { "localhost" } else { name };
    Some(match port {
        Some(p) => format!("{name}:{p}"),
        None => name.to_string(),
    })
}

pub(crate) fn configure(inner: &Arc<Inner>, cfg: &mut web::ServiceConfig) {
    let data = web::Data::new(inner.clone());
    let domain = inner.config.domain.clone();
    cfg.app_data(data.clone());
    cfg.service(
        web::scope("")
            .guard(guard::fn_guard(move |ctx| {
                target(ctx.head(), domain.as_deref()).is_some()
                    || crate::signed::is_signed(ctx.head())
            }))
            .app_data(data)
            .wrap(actix_web::middleware::from_fn(crate::caps::limit))
            .wrap(actix_web::middleware::from_fn(
                crate::admission::untime_client_streams,
            ))
            .default_service(web::to(sandbox_entry)),
    );
    // The control plane, in a scope of its own paths only (a scope answers every
    // path it takes, so it must take no other). Its key is checked first, before
    // anything reads a body (`admission::require_key`, the outermost middleware).
    let mut control = web::scope("")
        .guard(guard::fn_guard(|ctx| {
            is_control_path(ctx.head().uri.path())
        }))
        .wrap(actix_web::middleware::from_fn(crate::caps::limit))
        .wrap(actix_web::middleware::from_fn(
            crate::admission::require_key,
        ));
    for route in crate::table::CONTROL {
        control = control.route(route.path, route.route());
    }
    cfg.service(control.default_service(web::to(control::unknown)));
}

/// The collections of E2B's control plane: the paths under them (bare, or after a
/// `/v2/` or `/v3/` version) are E2B's, answered in E2B's shape, routes this server
/// does not offer included (a 404 `{"code", "message"}` its SDKs read).
const CONTROL_COLLECTIONS: &[&str] = &[
    "sandboxes",
    "templates",
    "volumes",
    "secrets",
    "snapshots",
    "tags",
];

/// Whether `path` is the control plane's (see [`CONTROL_COLLECTIONS`]).
fn is_control_path(path: &str) -> bool {
    let path = path.strip_prefix('/').unwrap_or(path);
    let path = ["v2/", "v3/"]
        .iter()
        .find_map(|v| path.strip_prefix(v))
        .unwrap_or(path);
    let first = path.split('/').next().unwrap_or_default();
    CONTROL_COLLECTIONS.contains(&first)
}

/// Every request addressed to a sandbox's port.
async fn sandbox_entry(
    inner: web::Data<Arc<Inner>>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    // A signed file URL that names no sandbox is the agent's, of the sandbox whose
    // token signed it (the count found it), or of none.
    let addressed = target(req.head(), inner.config.domain.as_deref()).or_else(|| {
        crate::signed::is_signed(req.head()).then(|| {
            let found = req
                .extensions()
                .get::<crate::access::Reached>()
                .map(|r| r.sbx.id.clone());
            (found.unwrap_or_default(), Some(ENVD_PORT))
        })
    });
    let Some((id, port)) = addressed else {
        return http_error(StatusCode::BAD_REQUEST, "no sandbox is addressed");
    };
    let Some(port) = port else {
        return http_error(
            StatusCode::BAD_REQUEST,
            "the sandbox's port (E2b-Sandbox-Port, or the `{port}-` of the host name) is not a port number: give 1 to 65535 in decimal, without a sign or leading zeros",
        );
    };
    let connect_rpc = crate::table::is_rpc_path(req.path());
    // A sandbox that is not open here, and one the request has no credential for
    // (whether it runs, is paused or has ended): the same answer, as the proxy in
    // front of E2B's agents gives it for a sandbox it does not know, so that an id
    // alone tells nothing.
    let not_found = || {
        let hint = format!(
            "The sandbox {id} was not found, or this request lacks the token its port {port} takes (X-Access-Token on {ENVD_PORT}; E2B-Traffic-Access-Token on the sandbox's other ports, unless it was created with network.allowPublicTraffic)"
        );
        if connect_rpc {
            ConnectError::new(Code::Unavailable, hint).unary_with(StatusCode::BAD_GATEWAY)
        } else {
            proxy_error(&id, "The sandbox was not found", hint)
        }
    };
    // What the count found (`caps::limit`, which wraps this): looked up once.
    let reached = req.extensions().get::<crate::access::Reached>().cloned();
    let Some(crate::access::Reached { sbx, access }) = reached else {
        return not_found();
    };
    match access {
        Access::Refused => return not_found(),
        // As E2B's agent answers it.
        Access::Expired => {
            return HttpResponse::Unauthorized()
                .json(serde_json::json!({"code": 401, "message": crate::signed::EXPIRED_MESSAGE}))
        }
        Access::Agent | Access::Ports => {}
    }
    // A paused sandbox's agent is not there, as E2B's proxy says of it: a 502, which
    // the SDK's `is_running()` reads as "not running".
    if sbx.paused.load(std::sync::atomic::Ordering::Acquire) {
        let hint = format!("sandbox {id} is paused; resume it with connect");
        return if connect_rpc {
            ConnectError::new(Code::Unavailable, hint).unary_with(StatusCode::BAD_GATEWAY)
        } else {
            proxy_error(&id, "The sandbox is paused", hint)
        };
    }
    match port {
        ENVD_PORT => envd(&inner, sbx, req, payload).await,
        CODE_INTERPRETER_PORT if sbx.code_interpreter => {
            match read_body(payload, process::MAX_MESSAGE).await {
                Ok(body) => crate::interpreter::route(sbx, &req, body.into()).await,
                Err(e) => http_error(StatusCode::PAYLOAD_TOO_LARGE, e.message),
            }
        }
        CODE_INTERPRETER_PORT => proxy_error(
            &id,
            "The sandbox is running but port is not open",
            format!(
                "port {CODE_INTERPRETER_PORT}: the sandbox's template serves no code interpreter; create it from code-interpreter-v1"
            ),
        ),
        other => {
            let bounds = (inner.max_body_bytes, inner.close_linger);
            crate::forward::forward(sbx, &req, payload, other, bounds).await
        }
    }
}

/// The sandbox agent's routes.
async fn envd(
    inner: &Inner,
    sbx: Arc<Sbx>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let path = req.path().to_string();
    let method = req.method().clone();
    if let Some(route) = AGENT.iter().find(|r| r.path == path) {
        let max = inner.max_file_bytes;
        return match (route.path, method.as_str()) {
            ("/health", "GET") => HttpResponse::NoContent().finish(),
            ("/files", "GET") => files::download(sbx, &req).await,
            ("/files", "POST") => files::upload(sbx, &req, payload, max).await,
            _ => {
                let allowed: Vec<&str> = AGENT
                    .iter()
                    .filter(|r| r.path == path)
                    .map(|r| r.method)
                    .collect();
                http_error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    format!("use {} on {path}", allowed.join(" or ")),
                )
            }
        };
    }
    if !crate::table::is_rpc_path(&path) {
        return http_error(
            StatusCode::NOT_FOUND,
            format!("{method} {path} is not a route of the sandbox agent"),
        );
    }
    if method != actix_web::http::Method::POST {
        return ConnectError::new(Code::Unimplemented, "Connect calls are POST").unary();
    }
    let ctype = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let streamed = match ctype.as_str() {
        "application/json" => false,
        "application/connect+json" => true,
        other => {
            return HttpResponse::UnsupportedMediaType().json(serde_json::json!({
                "code": "unimplemented",
                "message": format!("Content-Type {other:?}: this agent speaks Connect with JSON only (application/json, application/connect+json)"),
            }))
        }
    };
    let Some(rpc) = crate::table::rpc_at(&path) else {
        let e = ConnectError::new(
            Code::Unimplemented,
            format!("{path} is not a method this agent offers"),
        );
        return if streamed {
            stream_error(&e)
        } else {
            e.unary()
        };
    };
    if streamed && rpc.kind == RpcKind::ClientStream {
        return process::stream_input(sbx, payload)
            .await
            .unwrap_or_else(|e| stream_error(&e));
    }
    let body = match read_body(payload, process::MAX_MESSAGE).await {
        Ok(b) => b,
        Err(e) => {
            return if streamed {
                stream_error(&e)
            } else {
                e.unary()
            }
        }
    };
    if streamed {
        // A server stream's request is one envelope.
        let mut d = connect::Decoder::new(process::MAX_MESSAGE);
        d.push(&body);
        let message = match d.next() {
            Ok(Some((_, m))) => m,
            Ok(None) => {
                return stream_error(&ConnectError::invalid(
                    "the request holds no whole envelope",
                ))
            }
            Err(e) => return stream_error(&e),
        };
        let answer = match (rpc.kind, rpc.service, rpc.method) {
            (RpcKind::ServerStream, PROCESS, "Start") => process::start(sbx, &req, &message).await,
            (RpcKind::ServerStream, PROCESS, "Connect") => {
                process::connect_to(sbx, &req, &message).await
            }
            (RpcKind::ServerStream, FILESYSTEM, "WatchDir") => {
                crate::watch::watch_dir(sbx, &req, &message).await
            }
            _ => Err(ConnectError::new(
                Code::Unimplemented,
                format!("{path} is not a streaming method this agent offers"),
            )),
        };
        return answer.unwrap_or_else(|e| stream_error(&e));
    }
    let answer = match (rpc.kind, rpc.service) {
        (RpcKind::Unary, PROCESS) => process::unary(&sbx, rpc.method, &body)
            .await
            .map(|v| v.to_string()),
        (RpcKind::Unary, _) => files::unary(&sbx, rpc.method, &body).await,
        _ => Err(ConnectError::new(
            Code::Unimplemented,
            format!("{path} is a streaming method: call it with application/connect+json"),
        )),
    };
    match answer {
        Ok(json) => HttpResponse::Ok()
            .content_type("application/json")
            .body(json),
        Err(e) => e.unary(),
    }
}

/// A stream that ends at once with `error`.
fn stream_error(e: &ConnectError) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(connect::STREAM_JSON)
        .body(connect::end_of_stream(Some(e)))
}

async fn read_body(mut payload: web::Payload, max: usize) -> Result<Vec<u8>, ConnectError> {
    let mut body = Vec::new();
    while let Some(piece) = payload.next().await {
        let piece = piece.map_err(|e| ConnectError::invalid(format!("reading the body: {e}")))?;
        if body.len() + piece.len() > max {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("the request is larger than {max} bytes"),
            ));
        }
        body.extend_from_slice(&piece);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_mode_names_are_routed_by_their_first_label() {
        let at = |host: &str| {
            let mut req = actix_web::test::TestRequest::default();
            req = req.insert_header(("host", host));
            let req = req.to_http_request();
            (target(req.head(), None), url_mode_domain(&req))
        };
        assert_eq!(
            at("3000-sp-0123.localhost:8080"),
            (
                Some(("sp-0123".into(), Some(3000))),
                Some("3000-sp-0123.localhost:8080".into())
            )
        );
        assert_eq!(at("127.0.0.1:8080"), (None, Some("localhost:8080".into())));
        assert_eq!(at("[::1]:9"), (None, Some("localhost:9".into())));
        assert_eq!(at("10.1.2.3:8080"), (None, Some("10.1.2.3:8080".into())));
        assert_eq!(
            at("api.example.test"),
            (None, Some("api.example.test".into()))
        );
        // The first label of an address is no sandbox's.
        assert_eq!(at("3000-x").0, None);
    }

    #[test]
    fn the_control_planes_paths_are_e2bs_collections() {
        for p in [
            "/sandboxes",
            "/sandboxes/x/pause",
            "/v2/sandboxes",
            "/templates",
            "/templates/aliases/base",
            "/v3/templates",
            "/volumes",
            "/v2/volumes/x",
            "/secrets",
            "/snapshots",
        ] {
            assert!(is_control_path(p), "{p}");
        }
        for p in [
            "/",
            "/v1/sandboxes",
            "/v1/executions",
            "/sandboxesx",
            "/v4/sandboxes",
            "/health",
        ] {
            assert!(!is_control_path(p), "{p}");
        }
    }

    fn head(headers: &[(&str, &str)]) -> RequestHead {
        let mut h = RequestHead::default();
        for (k, v) in headers {
            h.headers.insert(
                actix_web::http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                actix_web::http::header::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn sandboxes_are_addressed_by_header_or_host() {
        let h = head(&[("e2b-sandbox-id", "sp-1"), ("e2b-sandbox-port", "49983")]);
        assert_eq!(target(&h, None), Some(("sp-1".into(), Some(49983))));
        let h = head(&[("host", "49999-sp-01ab-2.e2b.test:3000")]);
        assert_eq!(
            target(&h, Some("e2b.test")),
            Some(("sp-01ab-2".into(), Some(49999)))
        );
        // Without a domain (the URL mode), by the first label of the name.
        assert_eq!(
            target(&h, None),
            Some(("sp-01ab-2".into(), Some(49999))),
            "the URL mode's names"
        );
        // With one, only names under it.
        assert_eq!(target(&h, Some("other.test")), None);
        for host in [
            "e2b.test",
            "x-sp.e2b.test",
            "-sp.e2b.test",
            "8000-.e2b.test",
            "8000-sp.other.test",
        ] {
            assert_eq!(
                target(&head(&[("host", host)]), Some("e2b.test")),
                None,
                "{host}"
            );
        }
    }

    /// Another spelling of a port is no port: such a request is a sandbox's (so it
    /// never reaches the native API), with no port, which the entry answers 400 and
    /// the count does not count, by header and by host name alike.
    #[test]
    fn a_port_spelled_otherwise_addresses_no_port() {
        for port in ["049983", "+49983", "0", "65536", "", "49983 x"] {
            let h = head(&[("e2b-sandbox-id", "sp-1"), ("e2b-sandbox-port", port)]);
            assert_eq!(target(&h, None), Some(("sp-1".into(), None)), "{port:?}");
        }
        let h = head(&[("e2b-sandbox-id", "sp-1")]);
        assert_eq!(target(&h, None), Some(("sp-1".into(), None)));
        for host in [
            "049983-sp-1.e2b.test",
            "0049999-sp-1.e2b.test",
            "0-sp-1.e2b.test",
        ] {
            assert_eq!(
                target(&head(&[("host", host)]), Some("e2b.test")),
                Some(("sp-1".into(), None)),
                "{host}"
            );
        }
    }
}
