//! Tenants are walls in a fleet too: the two-tenant matrix over every route of the
//! route table, walked on a node that holds none of tenant A's objects and on the
//! node that owns A's sandbox. Tenant B gets 404 `NOT_FOUND` for each of A's
//! objects, answered exactly as for an id that never existed, and never one byte of
//! A's output, ids or code hashes; A's objects are untouched afterwards.

use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;

fn sh(script: &str) -> Value {
    json!({"program": {"command": ["sh", "-c", script]}})
}

/// What bob's answer says once the ids it named are taken out.
fn shape(answer: &(u16, Vec<u8>), ids: &[&str]) -> (u16, Value, String) {
    let v: Value = serde_json::from_slice(&answer.1).unwrap_or(Value::Null);
    let mut text = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for id in ids {
        text = text.replace(id, "<id>");
    }
    (answer.0, v["error"]["code"].clone(), text)
}

#[test]
fn tenant_b_sees_nothing_of_tenant_a_on_any_route_of_any_node() {
    let nats = need_nats!();
    let _turn = turn();
    let cluster = Cluster::start(&nats, 3);
    let urls = cluster.urls();
    let dir = cluster.dir();
    let fleet = format!("{FAST}prefix = \"walls\"\n");
    let nodes: Vec<Node> = (1..=3)
        .map(|i| Node::start(dir, &format!("w{i}"), &urls, &fleet, KEYS))
        .collect();
    let http = Http::default();
    let alice = bearer(ALICE);
    let bob = bearer(BOB);
    wait_up(&http, &nodes[0], 3, &alice);
    let (n1, n2, n3) = (&nodes[0], &nodes[1], &nodes[2]);
    let secret = format!("alice-secret-output-{}", std::process::id());

    // Alice's objects: a finished execution, a running one (both accepted by n1),
    // a sandbox on n2 with a file and a background process (made through n1).
    let (s, done) = http.post(
        &format!("{}/v1/executions", n1.url),
        &sh(&format!("echo {secret}")),
        &[("authorization", &alice)],
    );
    assert_eq!(s, 200, "{done}");
    assert_eq!(done["stdout"], format!("{secret}\n"), "{done}");
    let done_id = done["id"].as_str().unwrap().to_string();
    let (started_tx, started_rx) = mpsc::channel::<String>();
    let running_url = format!("{}/v1/executions?stream=true", n1.url);
    let auth = alice.clone();
    let running = std::thread::spawn(move || {
        let mut sent = false;
        Http::default().stream_with(
            &running_url,
            &sh("sleep 30"),
            &[("authorization", &auth)],
            |line| {
                if !sent {
                    if let Some(id) = line["id"].as_str() {
                        let _ = started_tx.send(id.to_string());
                        sent = true;
                    }
                }
            },
        )
    });
    let running_id = started_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the running execution's first line");
    let sandbox_id = open_on(&http, n2, ALICE);
    let base = format!("/v1/sandboxes/{sandbox_id}");
    let (s, _) = http.raw(
        "PUT",
        &format!("{}{base}/files/a.txt", n1.url),
        secret.clone().into_bytes(),
        &[("authorization", &alice)],
    );
    assert_eq!(s, 204);
    let (s, process) = http.post(
        &format!("{}{base}/processes", n1.url),
        &json!({"argv": ["sh", "-c", format!("echo {secret}; sleep 30")]}),
        &[("authorization", &alice)],
    );
    assert_eq!(s, 201, "{process}");
    let process_id = process["id"].as_str().unwrap().to_string();
    let (s, audit) = http.get(
        &format!("{}/v1/audit", n3.url),
        &[("authorization", &alice)],
    );
    assert_eq!(s, 200, "{audit}");
    let alice_hash = audit
        .as_array()
        .and_then(|a| a.iter().find(|e| e["id"] == done_id.as_str()))
        .map(|e| e["code_hash"].as_str().unwrap().to_string())
        .expect("alice's own audit has her execution, seen from another node");
    let mut markers = vec![
        secret.clone(),
        done_id.clone(),
        running_id.clone(),
        sandbox_id.clone(),
        alice_hash,
        "\"alice\"".to_string(),
    ];
    if let Some(e) = process["execution_id"].as_str() {
        markers.push(e.to_string());
    }
    let check = |route: &str, answer: &(u16, Vec<u8>), asked: &str| {
        let text = String::from_utf8_lossy(&answer.1);
        for m in markers.iter().filter(|m| m.as_str() != asked) {
            assert!(
                !text.contains(m.as_str()),
                "{route} answered bob with alice's `{m}`: {} {text}",
                answer.0
            );
        }
    };

    let never_sandbox = "sp-00000000000000000000000000000000-0";
    let never_execution = paddock_core::ExecutionId::new().to_string();
    let body_for = |method: &str, pattern: &str| -> Vec<u8> {
        let v = match (method, pattern) {
            ("POST", "/v1/executions") => sh("echo bob"),
            ("POST", p) if p.ends_with("/exec") => sh("cat a.txt"),
            ("POST", p) if p.ends_with("/processes") => json!({"argv": ["true"]}),
            ("POST", p) if p.ends_with("/terminals") => json!({}),
            ("POST", p) if p.ends_with("/signal") => json!({"signal": 9}),
            ("PUT", _) => return b"bob".to_vec(),
            ("POST", _) => json!({}),
            _ => return Vec::new(),
        };
        v.to_string().into_bytes()
    };
    let fill = |pattern: &str, id: &str, process: &str| {
        pattern
            .replace("{id}", id)
            .replace("{process}", process)
            .replace("{path}", "a.txt")
            .replace("{port}", "8000")
    };
    let ask = |node: &Node, method: &str, pattern: &str, path: &str| {
        http.raw(
            method,
            &format!("{}{path}", node.url),
            body_for(method, pattern),
            &[
                ("authorization", &bob),
                ("content-type", "application/json"),
            ],
        )
    };
    let mut walked = 0;
    for node in [n3, n2] {
        for (method, pattern) in paddock_pool::http::route_table() {
            let method = method.to_uppercase();
            let route = format!("{method} {pattern} on {}", node.id);
            if !pattern.contains('{') {
                let r = ask(node, &method, pattern, pattern);
                check(&route, &r, "");
                if method == "POST" && pattern == "/v1/sandboxes" {
                    // Bob's own sandbox: fine, and closed again.
                    let v: Value = serde_json::from_slice(&r.1).unwrap_or(Value::Null);
                    assert_eq!(r.0, 201, "{route}: {v}");
                    let id = v["id"].as_str().unwrap();
                    let (d, _) = http.delete(
                        &format!("{}/v1/sandboxes/{id}", n1.url),
                        &[("authorization", &bob)],
                    );
                    assert_eq!(d, 204);
                }
                walked += 1;
                continue;
            }
            let (targets, never): (Vec<&str>, &str) = if pattern.starts_with("/v1/executions/{id}")
            {
                (vec![&done_id, &running_id], &never_execution)
            } else {
                (vec![&sandbox_id], never_sandbox)
            };
            for target in targets {
                let r = ask(node, &method, pattern, &fill(pattern, target, &process_id));
                check(&route, &r, target);
                let (status, code, _) = shape(&r, &[]);
                assert_eq!(
                    (status, code.as_str()),
                    (404, Some("NOT_FOUND")),
                    "{route} on alice's object answered bob: {}",
                    String::from_utf8_lossy(&r.1)
                );
                let unknown = ask(node, &method, pattern, &fill(pattern, never, "p999"));
                assert_eq!(
                    shape(&r, &[target, &process_id]),
                    shape(&unknown, &[never, "p999"]),
                    "{route}: alice's id and an id that never existed answer bob differently"
                );
                walked += 1;
            }
        }
    }
    assert!(
        walked > 50,
        "the route table was walked twice ({walked} requests)"
    );

    // Bob's views are his own on every node: the audit (even asking for alice's),
    // the fleet's nodes without their addresses.
    for node in &nodes {
        for path in ["/v1/audit", "/v1/audit?tenant=alice"] {
            let (s, v) = http.get(&format!("{}{path}", node.url), &[("authorization", &bob)]);
            assert_eq!(s, 200, "{v}");
            let text = v.to_string();
            assert!(
                !text.contains(&done_id) && !text.contains("\"alice\""),
                "{text}"
            );
        }
        let (s, v) = http.get(
            &format!("{}/v1/fleet", node.url),
            &[("authorization", &bob)],
        );
        assert_eq!(s, 200, "{v}");
        assert!(
            v["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n.get("address").is_none()),
            "a tenant sees the nodes' addresses: {v}"
        );
    }
    let (_, v) = http.get(
        &format!("{}/v1/fleet", n3.url),
        &[("authorization", &bearer(ADMIN))],
    );
    assert!(
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["address"].is_string()),
        "the operator sees them: {v}"
    );

    // Nothing of alice's was touched, seen from a third node: her running
    // execution runs, her file says what she wrote, her process is alive.
    let (s, r) = http.get(
        &format!("{}/v1/executions/{running_id}", n3.url),
        &[("authorization", &alice)],
    );
    assert_eq!((s, r["status"].as_str()), (200, Some("running")), "{r}");
    let (s, file) = http.raw(
        "GET",
        &format!("{}{base}/files/a.txt", n3.url),
        Vec::new(),
        &[("authorization", &alice)],
    );
    assert_eq!(
        (s, String::from_utf8_lossy(&file).into_owned()),
        (200, secret.clone())
    );
    let (s, p) = http.get(
        &format!("{}{base}/processes/{process_id}", n3.url),
        &[("authorization", &alice)],
    );
    assert_eq!(s, 200, "{p}");
    assert!(p["exit"].is_null(), "{p}");

    // Alice ends her work from a node that runs none of it.
    let (s, c) = http.delete(
        &format!("{}/v1/executions/{running_id}", n3.url),
        &[("authorization", &alice)],
    );
    assert_eq!((s, c["cancelled"].as_bool()), (200, Some(true)), "{c}");
    let lines = running.join().unwrap();
    let end = &lines.last().expect("a last line").1;
    assert_eq!(end["outcome"], "cancelled", "{end}");
    let (s, _) = http.delete(&format!("{}{base}", n3.url), &[("authorization", &alice)]);
    assert_eq!(s, 204);
    let (s, r) = http.get(&format!("{}{base}", n1.url), &[("authorization", &bob)]);
    assert_eq!(
        (s, r["error"]["code"].as_str()),
        (404, Some("NOT_FOUND")),
        "{r}"
    );
}
