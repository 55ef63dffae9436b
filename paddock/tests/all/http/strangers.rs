//! Ids are worth nothing to a stranger: every id the API hands out carries a UUIDv4
//! (ids made in a burst share nothing but their tag), and a caller without a valid
//! key, or with another tenant's, gets the same answer for an object that exists
//! (running, or paused) and for one that never did, on every route of the table.

use paddock::PaddockConfig;
use paddock_core::ids::{is_random, longest_shared_prefix, parse_random, random_part};
use paddock_core::IsolationLevel;
use paddock_pool::http::ApiKey;
use serde_json::{json, Value};

use crate::http::client::{Request, Response};
use crate::http::support::{server_config, sh, TestServer};

const ALICE: &str = "key-alice-strangers-0123";
const BOB: &str = "key-bob-strangers-012345";

fn keyed_server() -> TestServer {
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 1;
    let mut server = server_config();
    server.api_keys = vec![ApiKey::new(ALICE, "alice"), ApiKey::new(BOB, "bob")];
    server.allowed_levels = Some(vec![IsolationLevel::None, IsolationLevel::Strict]);
    TestServer::start_with(paddock::builder().config(config), server)
}

fn as_(key: &str, r: Request) -> Request {
    r.header("Authorization", &format!("Bearer {key}"))
}

/// Whether this host runs containers (the engine with a freezer).
fn containers() -> bool {
    let found = ["crun", "runc"].iter().any(|r| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {r}")])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    assert!(
        found || std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
        "PADDOCK_REQUIRE_CONTAINERS is set but neither crun nor runc is installed"
    );
    found
}

/// Checks that `ids` are `{tag}-{UUIDv4}` (or bare UUIDv4s with `tag` empty) and
/// that no two share more than their tag and 8 hex digits.
fn unguessable(what: &str, tag: &str, ids: &[String]) {
    for id in ids {
        let u = if tag.is_empty() {
            parse_random(id)
        } else {
            random_part(id, tag)
        };
        let u = u.unwrap_or_else(|| panic!("{what}: `{id}` holds no UUIDv4"));
        assert_eq!(u.get_version_num(), 4, "{what}: {id}");
        assert!(is_random(&u), "{what}: {id}");
    }
    let prefix = if tag.is_empty() { 0 } else { tag.len() + 1 };
    let shared = longest_shared_prefix(ids);
    assert!(
        shared <= prefix + 8,
        "{what}: two ids share {shared} characters: {ids:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_made_in_a_burst_carry_122_random_bits() {
    let t = keyed_server();
    let addr = t.addr;
    let opened = futures_util::future::join_all(
        (0..6).map(|_| async move { as_(ALICE, Request::post("/v1/sandboxes")).send(addr).await }),
    )
    .await;
    let sandboxes: Vec<String> = opened
        .iter()
        .map(|r| r.expect(201)["id"].as_str().unwrap().to_string())
        .collect();
    unguessable("sandboxes", "sp", &sandboxes);
    let ran = futures_util::future::join_all((0..6).map(|_| async move {
        as_(ALICE, Request::post("/v1/executions"))
            .json(&sh("true"))
            .send(addr)
            .await
    }))
    .await;
    let executions: Vec<String> = ran
        .iter()
        .map(|r| r.expect(200)["id"].as_str().unwrap().to_string())
        .collect();
    unguessable("executions", "", &executions);
    let base = format!("/v1/sandboxes/{}", sandboxes[0]);
    let mut processes = Vec::new();
    let mut process_executions = Vec::new();
    for _ in 0..4 {
        let p = as_(ALICE, Request::post(&format!("{base}/processes")))
            .json(&json!({"argv": ["sleep", "30"]}))
            .send(addr)
            .await
            .expect(201);
        processes.push(p["id"].as_str().unwrap().to_string());
        process_executions.push(p["execution_id"].as_str().unwrap().to_string());
    }
    unguessable("processes", "p", &processes);
    unguessable("the processes' executions", "", &process_executions);
    t.stop().await;
}

/// What a stranger can tell from an answer: its status, error code and message with
/// the ids it named taken out.
fn shape(r: &Response, ids: &[&str]) -> (u16, Value, String) {
    let mut text = r.text();
    for id in ids {
        text = text.replace(id, "<id>");
    }
    let code = serde_json::from_str::<Value>(&r.text())
        .map(|v| v["error"]["code"].clone())
        .unwrap_or(Value::Null);
    (r.status, code, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_get_the_same_answer_for_an_id_that_exists_and_one_that_does_not() {
    let t = keyed_server();
    let addr = t.addr;
    // Alice's objects: a sandbox with a process, a finished execution, and (where the
    // container engine runs) a paused sandbox.
    let sandbox = as_(ALICE, Request::post("/v1/sandboxes"))
        .send(addr)
        .await
        .expect(201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let process = as_(
        ALICE,
        Request::post(&format!("/v1/sandboxes/{sandbox}/processes")),
    )
    .json(&json!({"argv": ["sleep", "30"]}))
    .send(addr)
    .await
    .expect(201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let execution = as_(ALICE, Request::post("/v1/executions"))
        .json(&sh("echo alice"))
        .send(addr)
        .await
        .expect(200)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut sandboxes = vec![(sandbox.clone(), "sp")];
    if containers() {
        let paused = as_(ALICE, Request::post("/v1/sandboxes"))
            .json(&json!({"level": "strict"}))
            .send(addr)
            .await
            .expect(201)["id"]
            .as_str()
            .unwrap()
            .to_string();
        let r = as_(
            ALICE,
            Request::post(&format!("/v1/sandboxes/{paused}/pause")),
        )
        .send(addr)
        .await;
        assert!(r.status < 300, "pause: {} {}", r.status, r.text());
        sandboxes.push((paused, "ct"));
    } else {
        eprintln!("the paused case skipped: no container engine here");
    }

    let strangers: [(&str, Option<&str>); 4] = [
        ("no key", None),
        ("a wrong key", Some("key-nobody-0123456789")),
        ("a malformed key", Some("x")),
        ("another tenant's key", Some(BOB)),
    ];
    let fill = |pattern: &str, id: &str, process: &str| {
        pattern
            .replace("{id}", id)
            .replace("{process}", process)
            .replace("{path}", "a.txt")
            .replace("{port}", "8000")
    };
    let mut walked = 0;
    for (method, pattern) in paddock_pool::http::route_table() {
        if !pattern.contains("{id}") {
            continue;
        }
        let method = method.to_uppercase();
        let targets: Vec<(String, &str)> = if pattern.starts_with("/v1/executions/") {
            vec![(execution.clone(), "")]
        } else {
            sandboxes.clone()
        };
        for (target, tag) in &targets {
            let never = if tag.is_empty() {
                paddock_core::ExecutionId::new().to_string()
            } else {
                paddock_core::ids::tagged(tag)
            };
            let never_process = paddock_core::ids::tagged("p");
            for (who, key) in strangers {
                let request = |path: String| {
                    let r = Request::new(&method, &path);
                    let r = match key {
                        Some(k) => as_(k, r),
                        None => r,
                    };
                    if method == "POST" || method == "PUT" {
                        r.json(&json!({"argv": ["true"], "program": {"command": ["true"]}}))
                    } else {
                        r
                    }
                };
                let real = request(fill(pattern, target, &process)).send(addr).await;
                let none = request(fill(pattern, &never, &never_process))
                    .send(addr)
                    .await;
                assert!(
                    (400..500).contains(&real.status),
                    "{method} {pattern} with {who}: {} {}",
                    real.status,
                    real.text()
                );
                assert_eq!(
                    shape(&real, &[target, &process]),
                    shape(&none, &[&never, &never_process]),
                    "{method} {pattern} with {who}: alice's object and one that never existed answer differently"
                );
                walked += 1;
            }
        }
    }
    assert!(
        walked > 60,
        "the route table was walked ({walked} requests)"
    );
    t.stop().await;
}
