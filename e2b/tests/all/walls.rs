//! The two-tenant matrix of the E2B surface, walked from its own tables
//! (`paddock_e2b::table`): a route or RPC added there is covered here at once.
//! Tenant B, with its own key and its own sandbox's tokens, reaches nothing of
//! tenant A's sandbox on any route; tenant A reaches every one of them on its own
//! sandbox (each is dispatched, none answers "no such route").

use paddock_e2b::table::{Rpc, RpcKind, AGENT, CONTROL, RPCS};
use paddock_e2b::TemplateConfig;
use serde_json::{json, Value};

use crate::live::{envelope, send, Answer, E2bServer, Req, ALICE, BOB};

fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field}: {v}"))
}

/// A request of `rpc` whose message ends at once (a watch of a directory that does
/// not exist, so that no stream stays open).
fn rpc_request(rpc: &Rpc) -> Req {
    let message = match rpc.method {
        "WatchDir" | "CreateWatcher" => json!({"path": "/home/user/no-such-directory"}),
        _ => json!({}),
    };
    let path = format!("/{}/{}", rpc.service, rpc.method);
    match rpc.kind {
        RpcKind::Unary => Req::new("POST", &path).json(&message),
        RpcKind::ServerStream | RpcKind::ClientStream => {
            Req::new("POST", &path).body("application/connect+json", envelope(&message))
        }
    }
}

/// Every agent route and RPC, addressed to sandbox `id` with access token `token`.
fn agent_requests(id: &str, token: &str) -> Vec<(String, Req)> {
    let mut out: Vec<(String, Req)> = AGENT
        .iter()
        .map(|r| {
            let req = match (r.method, r.path) {
                ("GET", "/files") => Req::new("GET", "/files?path=hello.txt"),
                ("POST", "/files") => Req::new("POST", "/files?path=hello.txt").body(
                    "multipart/form-data; boundary=walls",
                    b"--walls\r\nContent-Disposition: form-data; name=\"file\"; filename=\"hello.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--walls--\r\n".to_vec(),
                ),
                (m, p) => Req::new(m, p),
            };
            (format!("{} {}", r.method, r.path), req)
        })
        .collect();
    out.extend(
        RPCS.iter()
            .map(|r| (format!("{}/{}", r.service, r.method), rpc_request(r))),
    );
    out.into_iter()
        .map(|(name, req)| {
            (
                name,
                req.at_port(id, "49983").header("x-access-token", token),
            )
        })
        .collect()
}

/// A control-plane request of `route` for sandbox `id`, with `key`.
fn control_request(method: &str, path: &str, id: &str, key: &str) -> Req {
    // `{alias}`: a template's, the server's own (no tenant's).
    let mut path = path.replace("{id}", id).replace("{alias}", "base");
    if path == "/sandboxes/metrics" {
        // The sandboxes asked about: the one the matrix is about.
        path = format!("{path}?sandbox_ids={id}");
    }
    let req = Req::new(method, &path).header("x-api-key", key);
    if path.ends_with("/timeout") || path.ends_with("/connect") || path.ends_with("/resume") {
        req.json(&json!({"timeout": 60}))
    } else {
        req
    }
}

fn unimplemented(a: &Answer) -> bool {
    let text = a.text();
    text.contains("\"unimplemented\"") || text.contains("not a route of the sandbox agent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_b_reaches_nothing_of_tenant_a_on_any_e2b_route() {
    let t = E2bServer::start(64, &[("base", TemplateConfig::default())]);
    let alices = t.create(ALICE, "base", json!({})).await;
    let bobs = t.create(BOB, "base", json!({})).await;
    let (aid, atoken) = (
        str_of(&alices, "sandboxID"),
        str_of(&alices, "envdAccessToken"),
    );
    let btoken = str_of(&bobs, "envdAccessToken");

    // The agent: bob's token on alice's sandbox is no token at all.
    let walked = agent_requests(aid, btoken);
    assert_eq!(walked.len(), AGENT.len() + RPCS.len());
    for (name, req) in walked {
        let a = send(t.addr, req).await;
        assert_eq!(a.status, 502, "bob, {name}: {}", a.text());
        assert!(
            a.text().contains("was not found"),
            "bob, {name}: {}",
            a.text()
        );
    }
    // The control plane: every route that names a sandbox, as if it did not exist.
    let named: Vec<_> = CONTROL.iter().filter(|r| r.names_sandbox).collect();
    assert!(named.len() >= 7, "{}", named.len());
    for r in &named {
        let a = send(t.addr, control_request(r.method, r.path, aid, BOB)).await;
        assert_eq!(a.status, 404, "bob, {} {}: {}", r.method, r.path, a.text());
        assert!(!a.text().contains(atoken), "bob, {} {}", r.method, r.path);
    }
    let listed = send(
        t.addr,
        Req::new("GET", "/sandboxes").header("x-api-key", BOB),
    )
    .await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert!(
        !listed.text().contains(aid),
        "bob's list: {}",
        listed.text()
    );

    // Nor does a batch of metrics that names alice's sandbox, once it has some.
    let sampled = async {
        for _ in 0..100 {
            let a = send(
                t.addr,
                control_request("GET", "/sandboxes/{id}/metrics", aid, ALICE),
            )
            .await;
            if a.json().as_array().is_some_and(|s| !s.is_empty()) {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        false
    };
    assert!(sampled.await, "alice's sandbox got no metrics within 10 s");
    let batch = send(
        t.addr,
        control_request("GET", "/sandboxes/metrics", aid, BOB),
    )
    .await;
    assert_eq!(batch.status, 200, "{}", batch.text());
    assert!(
        !batch.text().contains(aid),
        "bob's metrics: {}",
        batch.text()
    );

    // Alice's sandbox went through all of that untouched, and every route of the
    // tables is one alice reaches on it (an RPC's own errors, such as `not_found`
    // for the missing directory, are answers of a dispatched call).
    for (name, req) in agent_requests(aid, atoken) {
        let a = send(t.addr, req).await;
        if name.ends_with(" /files") {
            assert_eq!(a.status, 200, "alice, {name}: {}", a.text());
        }
        assert!(
            a.status != 502 && !unimplemented(&a),
            "alice, {name}: {} {}",
            a.status,
            a.text()
        );
    }
    for r in CONTROL.iter().filter(|r| r.method == "GET") {
        let a = send(t.addr, control_request(r.method, r.path, aid, ALICE)).await;
        assert_eq!(
            a.status,
            200,
            "alice, {} {}: {}",
            r.method,
            r.path,
            a.text()
        );
        if r.path.contains("sandboxes") && !r.names_sandbox {
            assert!(a.text().contains(aid), "alice's list: {}", a.text());
        }
        if !r.path.contains("sandboxes") {
            // The server's own, the same for bob: nothing of alice's in it.
            let b = send(t.addr, control_request(r.method, r.path, aid, BOB)).await;
            assert_eq!((a.status, a.text()), (b.status, b.text()), "{}", r.path);
            assert!(!a.text().contains(aid), "{}: {}", r.path, a.text());
        }
    }
    t.stop().await;
}
