//! `GET /v1/openapi.json`: an OpenAPI 3 description of the routes, built from the
//! table the router mounts ([`ROUTES`]: each route's handler is in it, see
//! `routes.rs`). The schemas of the bodies,
//! queries and answers are generated (schemars) from the Rust types the handlers
//! parse and serialize, so the document cannot drift from the server.

use std::collections::BTreeMap;

use actix_web::web;

use paddock_core::api::{ExecBody, SandboxBody};
use paddock_core::{ExecutionId, FileEntry, ProcessSpec, TerminalSpec, WireResult};
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};

use super::answers::*;
use super::body::StreamQuery;
use super::interactive::{SignalBody, TcpQuery};
use super::operations::{AuditParams, LimitParam};
use super::sandboxes::DirQuery;
use crate::audit::{AuditEntry, OperatorAccess};
use crate::messages::{ProcessInfo, SandboxInfo};

/// Makes the schema of a type with a generator: a `$ref` to a component
/// ([`named`]) or the schema itself ([`inline`]).
pub(crate) type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// The schema of `T`, as a reference to its component when it has one.
fn named<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// The schema of `T` itself (for a query, whose properties become parameters).
fn inline<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    T::json_schema(generator)
}

/// What a route reads as its body.
#[derive(Clone, Copy)]
pub(crate) enum Body {
    /// Nothing.
    None,
    /// JSON of this schema; `required: false` when an empty body is taken too.
    Json { schema: SchemaFn, required: bool },
    /// Raw bytes.
    Bytes,
}

/// What a route answers on success.
#[derive(Clone, Copy)]
pub(crate) enum Answer {
    /// No body.
    Empty,
    /// JSON of this schema.
    Json(SchemaFn),
    /// JSON of this schema, or NDJSON lines with `?stream=true`.
    JsonOrNdjson(SchemaFn),
    /// Raw bytes.
    Bytes,
    /// Plain text.
    Text,
    /// A WebSocket (101 Switching Protocols).
    WebSocket,
}

/// Makes the route's actix `Route` (its handler; the method is added from the table).
pub(crate) type ServeFn = fn() -> actix_web::Route;

/// One route: what the router serves and the document describes.
#[derive(Clone, Copy)]
pub(crate) struct Route {
    /// The method, lower case.
    pub(crate) method: &'static str,
    /// The path pattern (`{id}`, `{path}`, `{process}` and `{port}` are parameters).
    pub(crate) path: &'static str,
    summary: &'static str,
    /// The success status.
    status: &'static str,
    /// The query, a struct whose fields are the parameters.
    query: Option<SchemaFn>,
    body: Body,
    answer: Answer,
    /// Statuses other than the success one whose body is not an error.
    also: &'static [(&'static str, SchemaFn)],
    /// Its handler, as the router mounts it.
    pub(crate) serve: ServeFn,
}

impl Route {
    const fn new(
        method: &'static str,
        path: &'static str,
        summary: &'static str,
        status: &'static str,
        answer: Answer,
    ) -> Route {
        Route {
            method,
            path,
            summary,
            status,
            query: None,
            body: Body::None,
            answer,
            also: &[],
            serve: unserved,
        }
    }

    /// The handler that serves it (every route of [`ROUTES`] names one: a test
    /// checks that none answers with [`unserved`]).
    const fn serve(mut self, serve: ServeFn) -> Route {
        self.serve = serve;
        self
    }

    /// The path as the router matches it: `{path}` takes the rest of the path,
    /// slashes included.
    pub(crate) fn mount_path(&self) -> String {
        self.path.replace("{path}", "{path:.*}")
    }

    const fn query(mut self, query: SchemaFn) -> Route {
        self.query = Some(query);
        self
    }

    const fn body(mut self, schema: SchemaFn) -> Route {
        self.body = Body::Json {
            schema,
            required: true,
        };
        self
    }

    const fn optional_body(mut self, schema: SchemaFn) -> Route {
        self.body = Body::Json {
            schema,
            required: false,
        };
        self
    }

    const fn bytes(mut self) -> Route {
        self.body = Body::Bytes;
        self
    }

    const fn also(mut self, also: &'static [(&'static str, SchemaFn)]) -> Route {
        self.also = also;
        self
    }
}

/// A route whose table entry names no handler: answers 500, so that the omission
/// shows (see the tests).
fn unserved() -> actix_web::Route {
    web::route().to(|| async { actix_web::HttpResponse::InternalServerError().finish() })
}

/// Every route: the router mounts this table, the OpenAPI document and the
/// two-tenant tests walk it.
pub(crate) const ROUTES: &[Route] = &[
    Route::new(
        "get",
        "/healthz",
        "Liveness",
        "200",
        Answer::Json(named::<Health>),
    )
    .serve(|| web::route().to(super::operations::healthz)),
    Route::new(
        "get",
        "/readyz",
        "Readiness (503 while draining)",
        "200",
        Answer::Json(named::<Readiness>),
    )
    .serve(|| web::route().to(super::operations::readyz))
    .also(&[("503", named::<Readiness>)]),
    Route::new(
        "get",
        "/metrics",
        "Prometheus text from the OpenTelemetry instruments",
        "200",
        Answer::Text,
    )
    .serve(|| web::route().to(super::operations::metrics)),
    Route::new(
        "get",
        "/v1/openapi.json",
        "This document",
        "200",
        Answer::Json(openapi_schema),
    )
    .serve(|| web::route().to(super::operations::openapi_json)),
    Route::new(
        "get",
        "/v1/stats",
        "Pool and audit statistics",
        "200",
        Answer::Json(named::<StatsAnswer>),
    )
    .serve(|| web::route().to(super::operations::stats)),
    Route::new(
        "get",
        "/v1/engines",
        "The engines this server runs, what each can do, and whether the caller may use it",
        "200",
        Answer::Json(named::<EnginesAnswer>),
    )
    .serve(|| web::route().to(super::operations::engines)),
    Route::new(
        "get",
        "/v1/fleet",
        "The nodes of the fleet this server belongs to (404 on a node on its own)",
        "200",
        Answer::Json(named::<FleetAnswer>),
    )
    .serve(|| web::route().to(super::operations::fleet)),
    Route::new(
        "get",
        "/v1/audit",
        "Search the audit log",
        "200",
        Answer::Json(named::<Vec<AuditEntry>>),
    )
    .serve(|| web::route().to(super::operations::audit))
    .query(inline::<AuditParams>),
    Route::new(
        "get",
        "/v1/audit/operator",
        "Recent uses of operator keys (operator keys only)",
        "200",
        Answer::Json(named::<Vec<OperatorAccess>>),
    )
    .serve(|| web::route().to(super::operations::operator_accesses))
    .query(inline::<LimitParam>),
    Route::new(
        "post",
        "/v1/executions",
        "Run one program (`?stream=true` for NDJSON)",
        "200",
        Answer::JsonOrNdjson(named::<WireResult<'static>>),
    )
    .serve(|| web::route().to(super::executions::create_execution))
    .query(inline::<StreamQuery>)
    .body(named::<ExecBody>),
    Route::new(
        "get",
        "/v1/executions/{id}",
        "A kept result, or the status of a running execution",
        "200",
        Answer::Json(named::<ExecutionAnswer<'static>>),
    )
    .serve(|| web::route().to(super::executions::get_execution)),
    Route::new(
        "delete",
        "/v1/executions/{id}",
        "Cancel a queued or running execution",
        "200",
        Answer::Json(named::<Cancelled>),
    )
    .serve(|| web::route().to(super::executions::cancel_execution)),
    Route::new(
        "post",
        "/v1/sandboxes",
        "Open a sandbox session (an empty body takes every default)",
        "201",
        Answer::Json(named::<SandboxInfo>),
    )
    .serve(|| web::route().to(super::sandboxes::create_sandbox))
    .optional_body(named::<SandboxBody>),
    Route::new(
        "get",
        "/v1/sandboxes/{id}",
        "A sandbox's status",
        "200",
        Answer::Json(named::<SandboxState>),
    )
    .serve(|| web::route().to(super::sandboxes::sandbox_status)),
    Route::new(
        "delete",
        "/v1/sandboxes/{id}",
        "Destroy a sandbox (idempotent)",
        "204",
        Answer::Empty,
    )
    .serve(|| web::route().to(super::sandboxes::destroy_sandbox)),
    Route::new(
        "post",
        "/v1/sandboxes/{id}/exec",
        "Run a program in the sandbox (`?stream=true` for NDJSON)",
        "200",
        Answer::JsonOrNdjson(named::<WireResult<'static>>),
    )
    .serve(|| web::route().to(super::sandboxes::sandbox_exec))
    .query(inline::<StreamQuery>)
    .body(named::<ExecBody>),
    Route::new(
        "post",
        "/v1/sandboxes/{id}/pause",
        "Freeze the sandbox's processes (engines with the `pause` feature)",
        "200",
        Answer::Json(named::<SandboxState>),
    )
    .serve(|| web::route().to(super::sandboxes::pause_sandbox)),
    Route::new(
        "post",
        "/v1/sandboxes/{id}/unpause",
        "Thaw a paused sandbox",
        "200",
        Answer::Json(named::<SandboxState>),
    )
    .serve(|| web::route().to(super::sandboxes::unpause_sandbox)),
    Route::new(
        "get",
        "/v1/sandboxes/{id}/files",
        "List files (`?dir=`); a missing directory lists as []",
        "200",
        Answer::Json(named::<Vec<FileEntry>>),
    )
    .serve(|| web::route().to(super::sandboxes::list_files))
    .query(inline::<DirQuery>),
    Route::new(
        "get",
        "/v1/sandboxes/{id}/files/{path}",
        "Read a file (raw bytes)",
        "200",
        Answer::Bytes,
    )
    .serve(|| web::route().to(super::sandboxes::read_file)),
    Route::new(
        "put",
        "/v1/sandboxes/{id}/files/{path}",
        "Write a file (raw bytes)",
        "204",
        Answer::Empty,
    )
    .serve(|| web::route().to(super::sandboxes::write_file))
    .bytes(),
    Route::new(
        "post",
        "/v1/sandboxes/{id}/processes",
        "Start a background process (engines with the `process` feature)",
        "201",
        Answer::Json(named::<ProcessInfo>),
    )
    .serve(|| web::route().to(super::interactive::start_process))
    .body(named::<ProcessSpec>),
    Route::new(
        "get",
        "/v1/sandboxes/{id}/processes",
        "The sandbox's processes and terminals",
        "200",
        Answer::Json(named::<ProcessList>),
    )
    .serve(|| web::route().to(super::interactive::list_processes)),
    Route::new(
        "get",
        "/v1/sandboxes/{id}/processes/{process}",
        "One process or terminal, with its exit once it ended",
        "200",
        Answer::Json(named::<ProcessInfo>),
    )
    .serve(|| web::route().to(super::interactive::get_process)),
    Route::new(
        "post",
        "/v1/sandboxes/{id}/processes/{process}/signal",
        "Signal a process's group",
        "200",
        Answer::Json(named::<Signalled>),
    )
    .serve(|| web::route().to(super::interactive::signal_process))
    .body(named::<SignalBody>),
    Route::new(
        "get",
        "/v1/sandboxes/{id}/processes/{process}/attach",
        "WebSocket: a process's or terminal's output, input and commands",
        "101",
        Answer::WebSocket,
    )
    .serve(|| web::route().to(super::interactive::attach)),
    Route::new(
        "post",
        "/v1/sandboxes/{id}/terminals",
        "Open a terminal (engines with the `terminal` feature)",
        "201",
        Answer::Json(named::<ProcessInfo>),
    )
    .serve(|| web::route().to(super::interactive::open_terminal))
    .body(named::<TerminalSpec>),
    Route::new(
        "get",
        "/v1/sandboxes/{id}/tcp/{port}",
        "WebSocket: a TCP stream to a service on the guest's loopback (`?host=`)",
        "101",
        Answer::WebSocket,
    )
    .serve(|| web::route().to(super::interactive::tcp))
    .query(inline::<TcpQuery>),
];

/// The answer of `GET /v1/openapi.json` (no Rust type: the document is built here).
fn openapi_schema(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "An OpenAPI 3.0 document.",
        "required": ["openapi", "info", "paths", "components"],
        "properties": {"openapi": {"type": "string"}},
    })
}

/// The statuses every route may answer with an error body.
const ERROR_STATUSES: &[&str] = &[
    "400", "401", "404", "408", "409", "413", "429", "502", "503",
];

/// Where the document's schemas live.
const COMPONENTS: &str = "#/components/schemas/";

/// The methods (upper case) the routes take on the concrete `path`; empty for a path
/// no route matches.
pub(crate) fn methods_for(path: &str) -> Vec<String> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let mut methods: Vec<String> = ROUTES
        .iter()
        .filter(|route| {
            let parts: Vec<&str> = route.path.split('/').collect();
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
        .map(|route| route.method.to_ascii_uppercase())
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

/// A generator's schema, with its transforms applied (those of the components are
/// applied when they are taken).
fn finish(generator: &mut SchemaGenerator, f: SchemaFn) -> Value {
    let mut schema = f(generator);
    for transform in generator.transforms_mut() {
        transform.transform(&mut schema);
    }
    schema.to_value()
}

/// Whether a schema admits only `null` (an `Option`'s `None`, as schemars writes it
/// for OpenAPI 3.0).
fn only_null(schema: &Value) -> bool {
    schema.get("nullable") == Some(&Value::Bool(true))
        && (schema.get("enum") == Some(&json!([null])) || schema.get("const") == Some(&Value::Null))
}

/// An `Option`'s schema without its `null`: a query parameter is absent, never null.
fn not_null(mut schema: Value) -> Value {
    let Some(object) = schema.as_object_mut() else {
        return schema;
    };
    object.remove("nullable");
    if object.get("default") == Some(&Value::Null) {
        object.remove("default");
    }
    if let Some(Value::Array(any)) = object.get("anyOf") {
        let rest: Vec<&Value> = any.iter().filter(|s| !only_null(s)).collect();
        if let [one] = rest[..] {
            let one = one.clone();
            object.remove("anyOf");
            if let (Value::Object(one), Some(object)) = (one, schema.as_object_mut()) {
                for (k, v) in one {
                    object.entry(k).or_insert(v);
                }
            }
        }
    }
    schema
}

/// The query parameters of a query struct: one per property.
fn query_parameters(generator: &mut SchemaGenerator, query: SchemaFn) -> Vec<Value> {
    let schema = finish(generator, query);
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut parameters = Vec::new();
    if let Some(properties) = schema["properties"].as_object() {
        for (name, property) in properties {
            let mut property = not_null(property.clone());
            let description = property
                .as_object_mut()
                .and_then(|p| p.remove("description"));
            let mut parameter = json!({
                "name": name,
                "in": "query",
                "required": required.contains(&name.as_str()),
                "schema": property,
            });
            if let Some(description) = description {
                parameter["description"] = description;
            }
            parameters.push(parameter);
        }
    }
    parameters
}

/// A JSON content entry.
fn json_content(schema: Value) -> Value {
    json!({"application/json": {"schema": schema}})
}

/// The success response of a route.
fn success(generator: &mut SchemaGenerator, answer: Answer) -> Value {
    match answer {
        Answer::Empty => json!({"description": "done; no body"}),
        Answer::Json(f) => {
            json!({"description": "success", "content": json_content(finish(generator, f))})
        }
        Answer::JsonOrNdjson(f) => {
            let mut content = json_content(finish(generator, f));
            // One JSON object a line (`started`, `stdout`/`stderr`, then `result` or
            // `error`): no one schema describes the body as a whole.
            content["application/x-ndjson"] = json!({});
            json!({"description": "the result (NDJSON lines with `?stream=true`)", "content": content})
        }
        Answer::Bytes => json!({
            "description": "the file's bytes",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
        }),
        Answer::Text => json!({
            "description": "Prometheus text exposition",
            "content": {"text/plain": {"schema": {"type": "string"}}}
        }),
        Answer::WebSocket => json!({"description": "switching to WebSocket"}),
    }
}

/// Points every `$ref` to a renamed component at its new name.
fn rename_refs(value: &mut Value, renamed: &BTreeMap<String, String>) {
    match value {
        Value::Object(object) => {
            for (key, v) in object.iter_mut() {
                if key == "$ref" {
                    if let Some(new) = v
                        .as_str()
                        .and_then(|r| r.strip_prefix(COMPONENTS))
                        .and_then(|name| renamed.get(name))
                    {
                        *v = Value::String(format!("{COMPONENTS}{new}"));
                    }
                } else {
                    rename_refs(v, renamed);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rename_refs(v, renamed)),
        _ => {}
    }
}

/// The OpenAPI document.
pub(crate) fn document() -> Value {
    // Bodies and queries are described as the server reads them (`Deserialize`),
    // answers as it writes them (`Serialize`: a field always written is required).
    let mut reads = SchemaSettings::openapi3()
        .for_deserialize()
        .into_generator();
    let mut writes = SchemaSettings::openapi3().for_serialize().into_generator();
    let error = finish(&mut writes, named::<ErrorBody<'static>>);
    let execution_id = finish(&mut reads, named::<ExecutionId>);
    let mut paths = Map::new();
    let mut answers: Vec<(String, String, Value)> = Vec::new();
    for route in ROUTES {
        let (method, path) = (route.method, route.path);
        let mut params = Vec::new();
        for name in ["id", "path", "process", "port"] {
            if path.contains(&format!("{{{name}}}")) {
                let schema = match name {
                    // Execution ids are UUIDs; sandbox and process ids are opaque.
                    "id" if path.starts_with("/v1/executions/") => execution_id.clone(),
                    "port" => json!({"type": "integer", "minimum": 1, "maximum": 65535}),
                    _ => json!({"type": "string", "minLength": 1}),
                };
                params
                    .push(json!({"name": name, "in": "path", "required": true, "schema": schema}));
            }
        }
        if let Some(query) = route.query {
            params.extend(query_parameters(&mut reads, query));
        }
        let mut op = json!({
            "operationId": operation_id(method, path),
            "summary": route.summary,
            "parameters": params,
        });
        match route.body {
            Body::None => {}
            Body::Json { schema, required } => {
                op["requestBody"] = json!({"required": required, "content": json_content(finish(&mut reads, schema))});
            }
            Body::Bytes => {
                op["requestBody"] = json!({"required": false, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}});
            }
        }
        let mut responses = Map::new();
        responses.insert(route.status.into(), success(&mut writes, route.answer));
        for (status, f) in route.also {
            responses.insert(
                (*status).into(),
                json!({"description": "not ready", "content": json_content(finish(&mut writes, *f))}),
            );
        }
        for status in ERROR_STATUSES {
            responses
                .entry(*status)
                .or_insert_with(|| json!({"$ref": "#/components/responses/Error"}));
        }
        answers.push((path.into(), method.into(), Value::Object(responses)));
        paths.entry(path.to_string()).or_insert_with(|| json!({}))[method] = op;
    }
    // One set of components: a type read and written alike is one schema; one whose
    // two forms differ keeps its name for the read form, and the written form is
    // renamed `…Answer`.
    let mut components = reads.take_definitions(true);
    let mut renamed = BTreeMap::new();
    let mut written = writes.take_definitions(true);
    for (name, schema) in &written {
        if components.get(name).is_some_and(|read| read != schema) {
            renamed.insert(name.clone(), format!("{name}Answer"));
        }
    }
    let mut error = error;
    rename_refs(&mut error, &renamed);
    for (path, method, mut responses) in answers {
        rename_refs(&mut responses, &renamed);
        paths[&path][&method]["responses"] = responses;
    }
    for (name, mut schema) in std::mem::take(&mut written) {
        rename_refs(&mut schema, &renamed);
        let name = renamed.get(&name).cloned().unwrap_or(name);
        components.insert(name, schema);
    }
    // Links, so that stateful tools can follow a created sandbox (or process) into
    // the routes that take its id.
    let link_from = |prefix: &str, param: &str| -> Value {
        let links: Map<String, Value> = ROUTES
            .iter()
            .filter(|r| r.path.starts_with(prefix) && r.path.len() > prefix.len())
            .map(|r| {
                let mut parameters = Map::new();
                parameters.insert(param.to_string(), json!("$response.body#/id"));
                if param == "process" {
                    parameters.insert("id".into(), json!("$request.path.id"));
                }
                let id = operation_id(r.method, r.path);
                (
                    id.clone(),
                    json!({"operationId": id, "parameters": parameters}),
                )
            })
            .collect();
        Value::Object(links)
    };
    paths["/v1/sandboxes"]["post"]["responses"]["201"]["links"] =
        link_from("/v1/sandboxes/{id}", "id");
    for path in [
        "/v1/sandboxes/{id}/processes",
        "/v1/sandboxes/{id}/terminals",
    ] {
        paths[path]["post"]["responses"]["201"]["links"] =
            link_from("/v1/sandboxes/{id}/processes/{process}", "process");
    }
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Paddock", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {
            "schemas": components,
            "responses": {"Error": {"description": "an error", "content": json_content(error)}}
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
        for Route { method, path, .. } in ROUTES {
            assert!(paths[*path][*method].is_object(), "{method} {path}");
            count += 1;
        }
        let documented: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
        assert_eq!(documented, count);
        assert_eq!(doc["openapi"], "3.0.3");
    }

    /// Every `$ref` under `value`.
    fn refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Object(object) => {
                for (key, v) in object {
                    match (key.as_str(), v.as_str()) {
                        ("$ref", Some(r)) => out.push(r),
                        _ => refs(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    #[test]
    fn every_json_body_and_answer_has_a_schema() {
        let doc = document();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let json_schema = |content: &Value, what: &str| {
            let schema = &content["application/json"]["schema"];
            assert!(
                schema.as_object().is_some_and(|s| !s.is_empty()),
                "{what}: a JSON body without a schema: {content}"
            );
        };
        for route in ROUTES {
            let what = format!("{} {}", route.method, route.path);
            let op = &doc["paths"][route.path][route.method];
            let body = &op["requestBody"];
            match route.body {
                Body::None => assert!(body.is_null(), "{what} reads no body: {body}"),
                Body::Json { required, .. } => {
                    json_schema(&body["content"], &what);
                    assert_eq!(body["required"], required, "{what}");
                }
                Body::Bytes => assert!(body["content"]["application/octet-stream"].is_object()),
            }
            let ok = &op["responses"][route.status]["content"];
            match route.answer {
                Answer::Json(_) => json_schema(ok, &what),
                Answer::JsonOrNdjson(_) => {
                    json_schema(ok, &what);
                    assert!(ok["application/x-ndjson"].is_object(), "{what}");
                }
                Answer::Empty | Answer::WebSocket => assert!(ok.is_null(), "{what}: {ok}"),
                Answer::Bytes | Answer::Text => {
                    assert!(ok.as_object().is_some_and(|c| c.len() == 1), "{what}")
                }
            }
            // Every other status answers an error body, or a schema of its own.
            for (status, response) in op["responses"].as_object().unwrap() {
                if status == route.status {
                    continue;
                }
                match response["$ref"].as_str() {
                    Some(r) => assert_eq!(r, "#/components/responses/Error", "{what}"),
                    None => json_schema(&response["content"], &what),
                }
            }
            for parameter in op["parameters"].as_array().unwrap() {
                let schema = parameter["schema"].as_object().unwrap();
                assert!(!schema.is_empty(), "{what}: {parameter}");
                assert!(!schema.contains_key("nullable"), "{what}: {parameter}");
            }
        }
        assert_eq!(
            doc["components"]["responses"]["Error"]["content"]["application/json"]["schema"]
                ["$ref"],
            "#/components/schemas/Error"
        );
        // Every reference resolves, and no component is a schema that takes anything.
        let mut found = Vec::new();
        refs(&doc, &mut found);
        for r in found {
            let name = r
                .strip_prefix(COMPONENTS)
                .or_else(|| r.strip_prefix("#/components/responses/"))
                .unwrap_or_else(|| panic!("a reference outside the components: {r}"));
            assert!(
                schemas.contains_key(name) || name == "Error",
                "{r} does not resolve"
            );
        }
        for (name, schema) in schemas {
            let object = schema.as_object().unwrap();
            assert!(
                ["type", "oneOf", "anyOf", "allOf", "enum"]
                    .iter()
                    .any(|k| object.contains_key(*k)),
                "{name} is vacuous: {schema}"
            );
        }
    }

    #[test]
    fn the_schemas_follow_the_types() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        // Bodies refuse unknown fields, as `deny_unknown_fields` does.
        for name in [
            "ExecBody",
            "SandboxBody",
            "ProcessSpec",
            "TerminalSpec",
            "SignalBody",
        ] {
            assert_eq!(schemas[name]["additionalProperties"], false, "{name}");
        }
        assert_eq!(schemas["ExecBody"]["required"], json!(["program"]));
        assert_eq!(
            schemas["EngineName"]["pattern"],
            paddock_core::isolation::ENGINE_NAME_PATTERN
        );
        assert_eq!(
            schemas["Limits"]["properties"]["timeout_ms"]["maximum"],
            24 * 3600 * 1000
        );
        // What a real serialized result holds, the ExecResult component requires,
        // and the reverse.
        let result = paddock_core::ExecResult::empty(
            paddock_core::ExecutionId::new(),
            paddock_core::Outcome::TimedOut,
            paddock_core::EngineName::NOOP,
            "sp-1",
        );
        let written = serde_json::to_value(&result).unwrap();
        let mut required: Vec<&str> = schemas["ExecResult"]["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let properties = schemas["ExecResult"]["properties"].as_object().unwrap();
        for field in written.as_object().unwrap().keys() {
            assert!(
                properties.contains_key(field) || field == "outcome",
                "{field} is not in the schema"
            );
        }
        required.push("outcome");
        for field in required {
            assert!(written.get(field).is_some(), "{field} is not written");
        }
        // The wire form adds its fields to the result's.
        let wire = &schemas["ExecutionResult"]["allOf"];
        assert_eq!(wire[0]["$ref"], format!("{COMPONENTS}ExecResult"));
        assert_eq!(
            wire[1]["required"],
            json!(["exit_code", "signal", "timed_out"])
        );
        // Query parameters come from the query types, `Option`s without their null.
        let audit = doc["paths"]["/v1/audit"]["get"]["parameters"]
            .as_array()
            .unwrap();
        let names: Vec<&str> = audit.iter().filter_map(|p| p["name"].as_str()).collect();
        assert_eq!(
            names,
            ["after", "before", "engine", "limit", "success", "tenant"]
        );
        let engine = audit.iter().find(|p| p["name"] == "engine").unwrap();
        assert_eq!(engine["schema"]["$ref"], format!("{COMPONENTS}EngineName"));
        assert_eq!(engine["required"], false);
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
