//! `GET /v1/openapi.json`: an OpenAPI 3 description of the routes, built from the same
//! table the router is checked against (see the tests).

use serde_json::{json, Value};

/// Every route: (method, path, summary, success status).
pub(crate) const ROUTES: &[(&str, &str, &str, &str)] = &[
    ("get", "/healthz", "Liveness", "200"),
    ("get", "/readyz", "Readiness (503 while draining)", "200"),
    (
        "get",
        "/metrics",
        "Prometheus text from the OpenTelemetry instruments",
        "200",
    ),
    ("get", "/v1/openapi.json", "This document", "200"),
    ("get", "/v1/stats", "Pool and audit statistics", "200"),
    ("get", "/v1/audit", "Search the audit log", "200"),
    (
        "get",
        "/v1/audit/operator",
        "Recent uses of operator keys (operator keys only)",
        "200",
    ),
    (
        "post",
        "/v1/executions",
        "Run one program (`?stream=true` for NDJSON)",
        "200",
    ),
    (
        "get",
        "/v1/executions/{id}",
        "A kept result, or the status of a running execution",
        "200",
    ),
    (
        "delete",
        "/v1/executions/{id}",
        "Cancel a queued or running execution",
        "200",
    ),
    ("post", "/v1/sandboxes", "Open a sandbox session", "201"),
    ("get", "/v1/sandboxes/{id}", "A sandbox's status", "200"),
    (
        "delete",
        "/v1/sandboxes/{id}",
        "Destroy a sandbox (idempotent)",
        "204",
    ),
    (
        "post",
        "/v1/sandboxes/{id}/exec",
        "Run a program in the sandbox (`?stream=true` for NDJSON)",
        "200",
    ),
    (
        "post",
        "/v1/sandboxes/{id}/pause",
        "Freeze the sandbox's processes (engines with the `pause` feature)",
        "200",
    ),
    (
        "post",
        "/v1/sandboxes/{id}/unpause",
        "Thaw a paused sandbox",
        "200",
    ),
    (
        "get",
        "/v1/sandboxes/{id}/files",
        "List files (`?dir=`); a missing directory lists as []",
        "200",
    ),
    (
        "get",
        "/v1/sandboxes/{id}/files/{path}",
        "Read a file (raw bytes)",
        "200",
    ),
    (
        "put",
        "/v1/sandboxes/{id}/files/{path}",
        "Write a file (raw bytes)",
        "204",
    ),
    (
        "post",
        "/v1/sandboxes/{id}/processes",
        "Start a background process (engines with the `process` feature)",
        "201",
    ),
    (
        "get",
        "/v1/sandboxes/{id}/processes",
        "The sandbox's processes and terminals",
        "200",
    ),
    (
        "get",
        "/v1/sandboxes/{id}/processes/{process}",
        "One process or terminal, with its exit once it ended",
        "200",
    ),
    (
        "post",
        "/v1/sandboxes/{id}/processes/{process}/signal",
        "Signal a process's group",
        "200",
    ),
    (
        "get",
        "/v1/sandboxes/{id}/processes/{process}/attach",
        "WebSocket: a process's or terminal's output, input and commands",
        "101",
    ),
    (
        "post",
        "/v1/sandboxes/{id}/terminals",
        "Open a terminal (engines with the `terminal` feature)",
        "201",
    ),
    (
        "get",
        "/v1/sandboxes/{id}/tcp/{port}",
        "WebSocket: a TCP stream to a service on the guest's loopback (`?host=`)",
        "101",
    ),
];

/// The methods (upper case) the routes take on the concrete `path`; empty for a path
/// no route matches.
pub(crate) fn methods_for(path: &str) -> Vec<String> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let mut methods: Vec<String> = ROUTES
        .iter()
        .filter(|(_, pattern, _, _)| {
            let parts: Vec<&str> = pattern.split('/').collect();
            // `{path}` (a file path) takes the rest of the path, slashes included.
            if parts.last() == Some(&"{path}") {
                segments.len() >= parts.len()
                    && parts[..parts.len() - 1]
                        .iter()
                        .zip(&segments)
                        .all(|(p, s)| p.starts_with('{') || p == s)
            } else {
                parts.len() == segments.len()
                    && parts
                        .iter()
                        .zip(&segments)
                        .all(|(p, s)| (p.starts_with('{') && !s.is_empty()) || p == s)
            }
        })
        .map(|(method, _, _, _)| method.to_ascii_uppercase())
        .collect();
    methods.sort();
    methods.dedup();
    methods
}

/// A stable operation id: the method and the path's words (`post_v1_sandboxes_id_exec`).
fn operation_id(method: &str, path: &str) -> String {
    let words: Vec<String> = path
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect();
    format!("{method}_{}", words.join("_"))
}

/// The OpenAPI document.
pub(crate) fn document() -> Value {
    let mut paths = serde_json::Map::new();
    for (method, path, summary, ok) in ROUTES {
        let entry = paths
            .entry((*path).to_string())
            .or_insert_with(|| json!({}));
        let mut params = Vec::new();
        for name in ["id", "path", "process", "port"] {
            if path.contains(&format!("{{{name}}}")) {
                let schema = match name {
                    // Execution ids are UUIDs; sandbox and process ids are opaque.
                    "id" if path.starts_with("/v1/executions/") => {
                        json!({"type": "string", "format": "uuid"})
                    }
                    "port" => json!({"type": "integer", "minimum": 1, "maximum": 65535}),
                    _ => json!({"type": "string", "minLength": 1}),
                };
                params
                    .push(json!({"name": name, "in": "path", "required": true, "schema": schema}));
            }
        }
        let mut op = json!({
            "operationId": operation_id(method, path),
            "summary": summary,
            "parameters": params,
            "responses": {
                *ok: {"description": "success"},
                "400": {"$ref": "#/components/responses/Error"},
                "401": {"$ref": "#/components/responses/Error"},
                "404": {"$ref": "#/components/responses/Error"},
                "409": {"$ref": "#/components/responses/Error"},
                "413": {"$ref": "#/components/responses/Error"},
                "429": {"$ref": "#/components/responses/Error"},
                "503": {"$ref": "#/components/responses/Error"}
            }
        });
        if path.ends_with("/exec") || *path == "/v1/executions" && *method == "post" {
            op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExecBody"}}}});
            op["parameters"]
                .as_array_mut()
                .expect("an array")
                .push(json!({"name": "stream", "in": "query", "schema": {"type": "boolean"}}));
        }
        let body = match (*method, *path) {
            ("post", "/v1/sandboxes/{id}/processes") => Some("ProcessSpec"),
            ("post", "/v1/sandboxes/{id}/terminals") => Some("TerminalSpec"),
            ("post", "/v1/sandboxes/{id}/processes/{process}/signal") => Some("SignalBody"),
            _ => None,
        };
        if let Some(schema) = body {
            op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}});
        }
        if path.ends_with("/tcp/{port}") {
            op["parameters"]
                .as_array_mut()
                .expect("an array")
                .push(json!({"name": "host", "in": "query", "schema": {"type": "string"}}));
        }
        // Links, so that stateful tools can follow a created sandbox (or process) into
        // the routes that take its id.
        let link_from = |prefix: &str, param: &str| -> Value {
            let links: serde_json::Map<String, Value> = ROUTES
                .iter()
                .filter(|(_, p, _, _)| p.starts_with(prefix) && p.len() > prefix.len())
                .map(|(m, p, _, _)| {
                    let mut parameters = serde_json::Map::new();
                    parameters.insert(
                        param.to_string(),
                        json!(format!("$response.body#/{}", "id")),
                    );
                    if param == "process" {
                        parameters.insert("id".into(), json!("$request.path.id"));
                    }
                    (
                        operation_id(m, p),
                        json!({"operationId": operation_id(m, p), "parameters": parameters}),
                    )
                })
                .collect();
            Value::Object(links)
        };
        if *method == "post" && *path == "/v1/sandboxes" {
            op["responses"][*ok]["links"] = link_from("/v1/sandboxes/{id}", "id");
        }
        if *method == "post"
            && (*path == "/v1/sandboxes/{id}/processes" || *path == "/v1/sandboxes/{id}/terminals")
        {
            op["responses"][*ok]["links"] =
                link_from("/v1/sandboxes/{id}/processes/{process}", "process");
        }
        entry[*method] = op;
    }
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Paddock", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "retry_after_ms": {"type": "integer"}}}}},
                "ExecBody": {"type": "object", "required": ["program"], "additionalProperties": false, "properties": {
                    "engine": {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,31}$", "description": "The name an engine is registered under: `subprocess`, `isolate` and `container` are built in; an embedder may register others. A name no engine is registered under is refused with CAPABILITY_NOT_SUPPORTED."},
                    "program": {"type": "object"},
                    "stdin": {"type": "string"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "cwd": {"type": "string"},
                    "limits": {"type": "object"},
                    "network": {},
                    "level": {"type": "string", "enum": ["none", "context-isolated", "strict"]}
                }},
                "ProcessSpec": {"type": "object", "required": ["argv"], "additionalProperties": false, "properties": {
                    "argv": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "cwd": {"type": "string"},
                    "stdin": {"type": "boolean"}
                }},
                "TerminalSpec": {"type": "object", "additionalProperties": false, "properties": {
                    "command": {"type": "string"},
                    "args": {"type": "array", "items": {"type": "string"}},
                    "size": {"type": "object", "required": ["rows", "cols"], "additionalProperties": false, "properties": {
                        "rows": {"type": "integer", "minimum": 1, "maximum": 1000},
                        "cols": {"type": "integer", "minimum": 1, "maximum": 1000}
                    }},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "cwd": {"type": "string"}
                }},
                "SignalBody": {"type": "object", "required": ["signal"], "additionalProperties": false, "properties": {
                    "signal": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": 64}, {"type": "string"}]}
                }}
            },
            "responses": {"Error": {"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_documented_once_with_its_method() {
        let doc = document();
        let paths = doc["paths"].as_object().unwrap();
        let mut count = 0;
        for (method, path, _, _) in ROUTES {
            assert!(paths[*path][*method].is_object(), "{method} {path}");
            count += 1;
        }
        let documented: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
        assert_eq!(documented, count);
        assert_eq!(doc["openapi"], "3.0.3");
    }

    #[test]
    fn methods_are_found_for_concrete_paths() {
        assert_eq!(methods_for("/v1/stats"), ["GET"]);
        assert_eq!(methods_for("/v1/sandboxes/sp-1"), ["DELETE", "GET"]);
        assert_eq!(
            methods_for("/v1/sandboxes/sp-1/files/a/b/c.txt"),
            ["GET", "PUT"]
        );
        assert_eq!(
            methods_for("/v1/sandboxes/sp-1/processes/p1/attach"),
            ["GET"]
        );
        assert!(methods_for("/v1/nothing").is_empty());
        assert!(methods_for("/v1/sandboxes/sp-1/bogus").is_empty());
        // Created sandboxes link to the routes that take their id.
        let doc = document();
        let links = &doc["paths"]["/v1/sandboxes"]["post"]["responses"]["201"]["links"];
        assert!(
            links["post_v1_sandboxes_id_exec"]["parameters"]["id"].is_string(),
            "{links}"
        );
    }
}
