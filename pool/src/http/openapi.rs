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
                params.push(json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}));
            }
        }
        let mut op = json!({
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
                    "engine": {"type": "string", "enum": ["subprocess", "isolate", "container", "noop"]},
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
}
