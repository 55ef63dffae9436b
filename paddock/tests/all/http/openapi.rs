//! `/v1/openapi.json` against the server's real answers.
//!
//! Every route of `paddock_pool::http::route_table()` is called with real ids (a
//! finished and a running execution, a sandbox with a file and a process), so a
//! route added later joins the walk: each answer's status and content type must be
//! declared by the document, each JSON answer must have a schema there and validate
//! against it, and a route that reads a JSON body must declare one.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::http::client::{Request, Response};
use crate::http::support::{sh, TestServer};

/// The document, with its schemas as plain JSON Schema (draft 7) for validation.
struct Document {
    doc: Value,
    schemas: Value,
}

/// OpenAPI 3.0's `nullable: true` as JSON Schema: the schema, or `null`.
fn to_json_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(object) => {
            let mut out: serde_json::Map<String, Value> = object
                .iter()
                .filter(|(k, _)| k.as_str() != "nullable")
                .map(|(k, v)| (k.clone(), to_json_schema(v)))
                .collect();
            if object.get("nullable") == Some(&Value::Bool(true)) {
                if let Some(Value::Array(values)) = out.get_mut("enum") {
                    values.push(Value::Null);
                }
                return json!({"anyOf": [Value::Object(out), {"type": "null"}]});
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(to_json_schema).collect()),
        other => other.clone(),
    }
}

impl Document {
    async fn fetch(addr: SocketAddr) -> Document {
        let doc = Request::get("/v1/openapi.json")
            .send(addr)
            .await
            .expect(200);
        let schemas = to_json_schema(&doc["components"]["schemas"]);
        Document { doc, schemas }
    }

    fn operation(&self, method: &str, pattern: &str) -> &Value {
        let op = &self.doc["paths"][pattern][method.to_lowercase()];
        assert!(op.is_object(), "{method} {pattern} is not in the document");
        op
    }

    /// `Ok` when `instance` is valid against `schema` (which may `$ref` components).
    fn validate(&self, schema: &Value, instance: &Value) -> Result<(), String> {
        let root = json!({
            "components": {"schemas": self.schemas},
            "allOf": [to_json_schema(schema)],
        });
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft7)
            .should_validate_formats(true)
            .build(&root)
            .map_err(|e| format!("the schema does not compile: {e}"))?;
        let errors: Vec<String> = validator
            .iter_errors(instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// The schema of a component, to validate against.
    fn component(&self, name: &str) -> Value {
        assert!(
            self.doc["components"]["schemas"][name].is_object(),
            "no component {name}"
        );
        json!({"$ref": format!("#/components/schemas/{name}")})
    }

    /// The declared response of `method pattern` for `status`, references resolved.
    fn response(&self, method: &str, pattern: &str, status: u16) -> Option<Value> {
        let declared = self.operation(method, pattern)["responses"].get(status.to_string())?;
        let declared = match declared["$ref"].as_str() {
            Some(r) => {
                let name = r
                    .strip_prefix("#/components/responses/")
                    .expect("a response");
                self.doc["components"]["responses"][name].clone()
            }
            None => declared.clone(),
        };
        Some(declared)
    }

    /// Checks one real answer of `method pattern`: its status and content type are
    /// declared, and a JSON body has a schema it is valid against. Returns the JSON
    /// schema it was checked against, if any.
    fn check(&self, method: &str, pattern: &str, r: &Response) -> Option<Value> {
        let what = format!("{method} {pattern} answered {}: {}", r.status, r.text());
        let declared = self
            .response(method, pattern, r.status)
            .unwrap_or_else(|| panic!("{what}\n(a status the document does not declare)"));
        let media = r
            .header("content-type")
            .map(|t| t.split(';').next().unwrap_or_default().trim().to_string());
        // No body: nothing to check but the status.
        let media = media.filter(|_| !r.body.is_empty())?;
        let content = &declared["content"][&media];
        assert!(
            content.is_object(),
            "{what}\n(content type {media} is not declared: {})",
            declared["content"]
        );
        if media != "application/json" {
            return None;
        }
        let schema = content["schema"].clone();
        assert!(
            schema.is_object() && schema != json!({}),
            "{what}\n(a JSON answer without a schema)"
        );
        if let Err(e) = self.validate(&schema, &r.json()) {
            panic!("{what}\ndoes not match its schema {schema}: {e}");
        }
        Some(schema)
    }

    /// Whether `method pattern` declares a JSON request body.
    fn takes_json(&self, method: &str, pattern: &str) -> bool {
        self.operation(method, pattern)["requestBody"]["content"]["application/json"]["schema"]
            .is_object()
    }
}

/// A valid body for each route that takes one.
fn bodies() -> BTreeMap<(&'static str, &'static str), Value> {
    BTreeMap::from([
        (("POST", "/v1/executions"), sh("echo hi")),
        (("POST", "/v1/sandboxes"), json!({"engine": "subprocess"})),
        (("POST", "/v1/sandboxes/{id}/exec"), sh("cat a.txt")),
        (
            ("POST", "/v1/sandboxes/{id}/processes"),
            json!({"argv": ["sleep", "30"]}),
        ),
        (
            ("POST", "/v1/sandboxes/{id}/processes/{process}/signal"),
            json!({"signal": "TERM"}),
        ),
        (
            ("POST", "/v1/sandboxes/{id}/terminals"),
            json!({"command": "sh", "size": {"rows": 24, "cols": 80}}),
        ),
    ])
}

/// A sandbox with a file `a.txt` and a background process: (sandbox, process).
async fn sandbox(addr: SocketAddr, doc: &Document) -> (String, String) {
    let r = Request::post("/v1/sandboxes")
        .json(&json!({}))
        .send(addr)
        .await;
    doc.check("POST", "/v1/sandboxes", &r);
    let id = r.expect(201)["id"].as_str().unwrap().to_string();
    let put = Request::put(&format!("/v1/sandboxes/{id}/files/a.txt"))
        .body(b"hello".to_vec())
        .send(addr)
        .await;
    assert_eq!(put.status, 204, "{}", put.text());
    let r = Request::post(&format!("/v1/sandboxes/{id}/processes"))
        .json(&json!({"argv": ["sh", "-c", "echo up; sleep 30"]}))
        .send(addr)
        .await;
    doc.check("POST", "/v1/sandboxes/{id}/processes", &r);
    let process = r.expect(201)["id"].as_str().unwrap().to_string();
    (id, process)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_what_the_document_declares() {
    let t = TestServer::start();
    let addr = t.addr;
    let doc = Document::fetch(addr).await;
    let bodies = bodies();

    // The objects the routes name.
    let r = Request::post("/v1/executions")
        .json(&sh("echo done"))
        .send(addr)
        .await;
    doc.check("POST", "/v1/executions", &r);
    let done = r.expect(200)["id"].as_str().unwrap().to_string();
    let mut running = Request::post("/v1/executions?stream=true")
        .json(&sh("sleep 30"))
        .stream(addr)
        .await;
    let (_, started) = running.next_line().await.expect("a started line");
    let running_id = started["id"].as_str().unwrap().to_string();
    let (sandbox_id, process_id) = sandbox(addr, &doc).await;

    // Every route, deletions last (they end the objects the others name).
    let mut routes: Vec<(&str, &str)> = paddock_pool::http::route_table().collect();
    routes.sort_by_key(|(method, _)| *method == "delete");
    let mut checked = 0;
    for (method, pattern) in routes {
        let method = method.to_uppercase();
        let ids: Vec<&str> = if pattern.starts_with("/v1/executions/{id}") {
            if method == "GET" {
                vec![&done, &running_id]
            } else {
                vec![&running_id]
            }
        } else {
            vec![&sandbox_id]
        };
        for id in ids {
            let path = pattern
                .replace("{id}", id)
                .replace("{process}", &process_id)
                .replace("{path}", "a.txt")
                .replace("{port}", "9");
            let mut req = Request::new(&method, &path);
            if let Some(body) = bodies.get(&(method.as_str(), pattern)) {
                req = req.json(body);
            } else {
                assert!(
                    !doc.takes_json(&method, pattern),
                    "{method} {pattern} takes a JSON body: give the walk one"
                );
                if method == "PUT" {
                    req = req.body(b"hello".to_vec());
                }
            }
            let r = req.send(addr).await;
            assert!(r.status < 500, "{method} {path}: {} {}", r.status, r.text());
            doc.check(&method, pattern, &r);
            checked += 1;
            // Streamed, the result line is the same result.
            let streams = doc.operation(&method, pattern)["responses"]["200"]["content"]
                ["application/x-ndjson"]
                .is_object();
            if streams && r.status == 200 {
                let lines = Request::new(&method, &format!("{path}?stream=true"))
                    .json(&bodies[&(method.as_str(), pattern)])
                    .stream(addr)
                    .await
                    .lines()
                    .await;
                let (_, mut last) = lines.last().cloned().expect("a last line");
                assert_eq!(last["type"], "result", "{last}");
                last.as_object_mut().unwrap().remove("type");
                let schema = &doc.operation(&method, pattern)["responses"]["200"]["content"]
                    ["application/json"]["schema"];
                doc.validate(schema, &last)
                    .unwrap_or_else(|e| panic!("{method} {path} streamed {last}: {e}"));
            }
        }
    }
    assert!(checked > 25, "walked {checked}");
    let _ = running.lines().await;

    // A route that reads no JSON body ignores a broken one; one that reads it
    // refuses it with 400, as declared.
    let (sandbox_id, process_id) = sandbox(addr, &doc).await;
    let mut routes: Vec<(&str, &str)> = paddock_pool::http::route_table().collect();
    routes.sort_by_key(|(method, _)| *method == "delete");
    for (method, pattern) in routes {
        let method = method.to_uppercase();
        let path = pattern
            .replace(
                "{id}",
                if pattern.starts_with("/v1/executions/") {
                    &done
                } else {
                    &sandbox_id
                },
            )
            .replace("{process}", &process_id)
            .replace("{path}", "b.txt")
            .replace("{port}", "9");
        let r = Request::new(&method, &path)
            .header("Content-Type", "application/json")
            .body(b"{".to_vec())
            .send(addr)
            .await;
        doc.check(&method, pattern, &r);
        let message = serde_json::from_slice::<Value>(&r.body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_default();
        // What `parse_body` answers for a body that is not the JSON it reads.
        let body_refused = r.status == 400
            && message.starts_with("request field `")
            && message.ends_with("see docs/http-api.md");
        assert_eq!(
            body_refused,
            doc.takes_json(&method, pattern),
            "{method} {pattern}: {} {message}",
            r.status
        );
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_of_every_outcome_and_errors_match_their_schemas() {
    let t = TestServer::start();
    let addr = t.addr;
    let doc = Document::fetch(addr).await;
    let run = |body: Value| async move {
        let r = Request::post("/v1/executions").json(&body).send(addr).await;
        (r.status, r)
    };
    let mut outcomes = Vec::new();
    for body in [
        sh("echo out; echo err >&2; exit 3"),
        json!({"program": {"command": ["sleep", "5"]}, "limits": {"timeout_ms": 200}}),
        json!({"program": {"command": ["sh", "-c", "exec head -c 5000000 /dev/zero > big"]},
               "limits": {"file_size_bytes": 1048576}}),
        json!({"engine": "isolate", "program": {"handler": "(a, b) => a * b", "input": [6, 7]}}),
        json!({"program": {"command": ["sh", "-c", "kill -9 $$"]}}),
        // Refused: an error answer, checked the same way.
        json!({"program": {"command": ["no-such-program-here"]}}),
    ] {
        let (status, r) = run(body).await;
        let schema = doc.check("POST", "/v1/executions", &r);
        if status == 200 {
            assert!(schema.is_some());
            let v = r.json();
            outcomes.push(v["outcome"].as_str().unwrap_or_default().to_string());
            // What the document says a result holds, a real one holds.
            let result = &doc.doc["components"]["schemas"]["ExecResult"];
            for field in result["required"].as_array().unwrap() {
                assert!(v.get(field.as_str().unwrap()).is_some(), "{field} in {v}");
            }
            let id = v["id"].as_str().unwrap();
            let kept = Request::get(&format!("/v1/executions/{id}"))
                .send(addr)
                .await;
            doc.check("GET", "/v1/executions/{id}", &kept);
        }
    }
    for expected in ["completed", "timed_out", "limit_exceeded"] {
        assert!(outcomes.iter().any(|o| o == expected), "{outcomes:?}");
    }
    // The components stand for real answers on their own too.
    let r = Request::post("/v1/sandboxes").send(addr).await;
    doc.validate(&doc.component("SandboxInfo"), &r.expect(201))
        .unwrap();
    let r = Request::post("/v1/executions")
        .json(&json!({"program": {"command": ["true"]}, "bogus": 1}))
        .send(addr)
        .await;
    r.expect_error(400, "INVALID_OPTIONS");
    doc.validate(&doc.component("Error"), &r.json()).unwrap();
    doc.check("POST", "/v1/executions", &r);
    // And the schemas are not vacuous: a misshapen answer fails them.
    let result = doc.component("ExecutionResult");
    assert!(doc.validate(&result, &json!({"id": "x"})).is_err());
    assert!(doc
        .validate(&doc.component("Error"), &json!({"code": "X"}))
        .is_err());
    t.stop().await;
}
