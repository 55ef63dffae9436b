//! Every route and RPC of the E2B-compatible surface, in one place: the router
//! mounts the control plane's routes from [`CONTROL`] and dispatches the sandbox
//! agent's calls by [`AGENT`] and [`RPCS`]; the two-tenant tests walk all three, so
//! a route added here is in the matrix at once.

use actix_web::web;

use crate::control;

/// A route of the control plane (`X-API-Key`).
#[derive(Debug, Clone, Copy)]
pub struct ControlRoute {
    /// `GET`, `POST`, `DELETE`.
    pub method: &'static str,
    /// The path, `{id}` standing for a sandbox id.
    pub path: &'static str,
    /// Whether the route names one sandbox (`{id}`), which another tenant must not
    /// reach.
    pub names_sandbox: bool,
    serve: fn() -> actix_web::Route,
}

impl ControlRoute {
    const fn new(
        method: &'static str,
        path: &'static str,
        serve: fn() -> actix_web::Route,
    ) -> Self {
        ControlRoute {
            method,
            path,
            names_sandbox: has_id(path.as_bytes()),
            serve,
        }
    }

    /// The route actix mounts: the handler, for this method only.
    pub(crate) fn route(&self) -> actix_web::Route {
        let method = actix_web::http::Method::from_bytes(self.method.as_bytes())
            .expect("the table's methods are valid");
        (self.serve)().method(method)
    }
}

/// Whether `path` holds `{id}` (a `const fn`, for the table).
const fn has_id(path: &[u8]) -> bool {
    let mut i = 0;
    while i + 4 <= path.len() {
        if path[i] == b'{' && path[i + 1] == b'i' && path[i + 2] == b'd' && path[i + 3] == b'}' {
            return true;
        }
        i += 1;
    }
    false
}

/// The control plane: E2B's sandbox lifecycle, under `/sandboxes` and `/v2/sandboxes`,
/// and the templates sandboxes open from.
pub const CONTROL: &[ControlRoute] = &[
    ControlRoute::new("POST", "/sandboxes", || web::route().to(control::create)),
    ControlRoute::new("POST", "/v2/sandboxes", || web::route().to(control::create)),
    ControlRoute::new("GET", "/sandboxes", || web::route().to(control::list)),
    ControlRoute::new("GET", "/v2/sandboxes", || web::route().to(control::list)),
    ControlRoute::new("GET", "/sandboxes/metrics", || {
        web::route().to(crate::metrics::latest_metrics)
    }),
    ControlRoute::new("GET", "/sandboxes/{id}", || web::route().to(control::get)),
    ControlRoute::new("GET", "/sandboxes/{id}/metrics", || {
        web::route().to(crate::metrics::sandbox_metrics)
    }),
    ControlRoute::new("DELETE", "/sandboxes/{id}", || {
        web::route().to(control::kill)
    }),
    ControlRoute::new("POST", "/sandboxes/{id}/timeout", || {
        web::route().to(control::set_timeout)
    }),
    ControlRoute::new("POST", "/sandboxes/{id}/pause", || {
        web::route().to(control::pause)
    }),
    ControlRoute::new("POST", "/sandboxes/{id}/resume", || {
        web::route().to(control::connect)
    }),
    ControlRoute::new("POST", "/sandboxes/{id}/connect", || {
        web::route().to(control::connect)
    }),
    ControlRoute::new("POST", "/v2/sandboxes/{id}/connect", || {
        web::route().to(control::connect)
    }),
    ControlRoute::new("GET", "/templates/aliases/{alias}", || {
        web::route().to(control::alias)
    }),
];

/// A plain HTTP route of a sandbox's agent (port 49983, `X-Access-Token`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentRoute {
    /// `GET` or `POST`.
    pub method: &'static str,
    /// The path.
    pub path: &'static str,
}

/// The agent's plain HTTP routes (its Connect services are [`RPCS`]).
pub const AGENT: &[AgentRoute] = &[
    AgentRoute {
        method: "GET",
        path: "/health",
    },
    AgentRoute {
        method: "POST",
        path: "/files",
    },
    AgentRoute {
        method: "GET",
        path: "/files",
    },
];

/// How an RPC's messages travel (Connect with JSON messages, always `POST`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcKind {
    /// One request, one answer (`application/json`).
    Unary,
    /// One request envelope, a stream of answers (`application/connect+json`).
    ServerStream,
    /// A stream of request envelopes for as long as the client likes, one answer
    /// (`application/connect+json`).
    ClientStream,
}

/// A Connect RPC of a sandbox's agent, at `POST /{service}/{method}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rpc {
    /// `process.Process` or `filesystem.Filesystem`.
    pub service: &'static str,
    /// The method's name.
    pub method: &'static str,
    /// How its messages travel.
    pub kind: RpcKind,
}

/// The process service.
pub const PROCESS: &str = "process.Process";
/// The file system service.
pub const FILESYSTEM: &str = "filesystem.Filesystem";

const fn rpc(service: &'static str, method: &'static str, kind: RpcKind) -> Rpc {
    Rpc {
        service,
        method,
        kind,
    }
}

/// Every RPC of the agent's Connect services.
pub const RPCS: &[Rpc] = &[
    rpc(PROCESS, "Start", RpcKind::ServerStream),
    rpc(PROCESS, "Connect", RpcKind::ServerStream),
    rpc(PROCESS, "StreamInput", RpcKind::ClientStream),
    rpc(PROCESS, "List", RpcKind::Unary),
    rpc(PROCESS, "SendInput", RpcKind::Unary),
    rpc(PROCESS, "SendSignal", RpcKind::Unary),
    rpc(PROCESS, "CloseStdin", RpcKind::Unary),
    rpc(PROCESS, "Update", RpcKind::Unary),
    rpc(FILESYSTEM, "Stat", RpcKind::Unary),
    rpc(FILESYSTEM, "ListDir", RpcKind::Unary),
    rpc(FILESYSTEM, "MakeDir", RpcKind::Unary),
    rpc(FILESYSTEM, "Move", RpcKind::Unary),
    rpc(FILESYSTEM, "Remove", RpcKind::Unary),
    rpc(FILESYSTEM, "WatchDir", RpcKind::ServerStream),
    rpc(FILESYSTEM, "CreateWatcher", RpcKind::Unary),
    rpc(FILESYSTEM, "GetWatcherEvents", RpcKind::Unary),
    rpc(FILESYSTEM, "RemoveWatcher", RpcKind::Unary),
];

/// The RPC at `path` (`/{service}/{method}`), if the agent offers it.
pub(crate) fn rpc_at(path: &str) -> Option<&'static Rpc> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    RPCS.iter()
        .find(|r| r.service == service && r.method == method)
}

/// Whether `path` is under one of the agent's Connect services.
pub(crate) fn is_rpc_path(path: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .is_some_and(|(service, _)| service == PROCESS || service == FILESYSTEM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_naming_a_sandbox_are_marked() {
        let named: Vec<_> = CONTROL
            .iter()
            .filter(|r| r.names_sandbox)
            .map(|r| r.path)
            .collect();
        assert!(named.contains(&"/sandboxes/{id}"));
        assert!(!CONTROL
            .iter()
            .any(|r| r.path == "/sandboxes" && r.names_sandbox));
        for r in CONTROL {
            assert_eq!(r.names_sandbox, r.path.contains("{id}"), "{}", r.path);
        }
    }

    #[test]
    fn rpcs_are_found_by_path_and_nothing_else_is() {
        assert_eq!(
            rpc_at("/process.Process/Start").map(|r| r.kind),
            Some(RpcKind::ServerStream)
        );
        assert_eq!(
            rpc_at("/filesystem.Filesystem/Stat").map(|r| r.kind),
            Some(RpcKind::Unary)
        );
        for path in [
            "/process.Process/Nope",
            "/process.Process",
            "process.Process/Start",
            "/other.Service/Start",
            "/process.Process/Start/x",
        ] {
            assert!(rpc_at(path).is_none(), "{path}");
        }
        assert!(is_rpc_path("/process.Process/Nope"));
        assert!(!is_rpc_path("/files"));
    }
}
