//! A tenant's concurrency caps hold across the fleet: `max_concurrent_per_tenant`,
//! `max_sandboxes_per_tenant` and `max_slots_per_tenant` count what the tenant
//! holds on every node, not on each; another tenant has caps of its own; a place is
//! given back when its execution ends or its sandbox is destroyed, and a lost
//! node's sandboxes stop counting.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;

/// The caps: two executions, two sandboxes, three slots per tenant.
const CAPS: &str = "[limiter]\nmax_concurrent_per_tenant = 2\nmax_sandboxes_per_tenant = 2\nmax_slots_per_tenant = 3\n";

fn sleeper(seconds: &str) -> Value {
    json!({"program": {"command": ["sleep", seconds]}})
}

/// Sends `n` executions of `body` at once, through the nodes in turn, as `key`'s
/// tenant: the statuses and error codes, in no order.
fn at_once(nodes: &[Node], key: &str, n: usize, body: &Value) -> Vec<(u16, String)> {
    std::thread::scope(|scope| {
        let calls: Vec<_> = (0..n)
            .map(|i| {
                let url = format!("{}/v1/executions", nodes[i % nodes.len()].url);
                let auth = bearer(key);
                scope.spawn(move || {
                    let (s, r) = Http::default().post(&url, body, &[("authorization", &auth)]);
                    let code = r["error"]["code"].as_str().unwrap_or("").to_string();
                    if s != 200 && s != 429 {
                        eprintln!("{url}: {s} {r}");
                    }
                    (s, code)
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    })
}

fn count(answers: &[(u16, String)], status: u16, code: &str) -> usize {
    answers
        .iter()
        .filter(|(s, c)| *s == status && c == code)
        .count()
}

#[test]
fn a_tenants_concurrency_caps_hold_across_the_fleet() {
    let nats = need_nats!();
    let _turn = turn();
    let cluster = Cluster::start(&nats, 3);
    let urls = cluster.urls();
    let dir = cluster.dir();
    let fleet = format!("{FAST}prefix = \"caps\"\n");
    // The E2B-compatible API too, with a template on the subprocess engine: its
    // sandboxes take their places in the same fleet-wide shares.
    let extra =
        format!("{CAPS}{KEYS}[e2b]\nenabled = true\n[templates.quick]\nengine = \"subprocess\"\n");
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| Node::start(dir, &format!("q{i}"), &urls, &fleet, &extra))
        .collect();
    let http = Http::default();
    let alice = bearer(ALICE);
    wait_up(&http, &nodes[0], 3, &alice);

    // Executions: six at once per tenant over three nodes (each node's own limiter
    // would take two, six in all); the fleet takes two of each tenant.
    let answers: Vec<Vec<(u16, String)>> = std::thread::scope(|scope| {
        let nodes = &nodes;
        let a = scope.spawn(move || at_once(nodes, ALICE, 6, &sleeper("2")));
        let b = scope.spawn(move || at_once(nodes, BOB, 6, &sleeper("2")));
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    for (who, got) in ["alice", "bob"].iter().zip(&answers) {
        assert_eq!(count(got, 200, ""), 2, "{who}: {got:?}");
        assert_eq!(count(got, 429, "RATE_LIMITED"), 4, "{who}: {got:?}");
    }
    // Their places came back with their results.
    let got = at_once(&nodes, ALICE, 2, &json!({"program": {"command": ["true"]}}));
    assert_eq!(count(&got, 200, ""), 2, "{got:?}");

    // Sandboxes: two of alice's, on two nodes; a third is refused on the third
    // node, which holds none of hers.
    let s1 = open_on(&http, &nodes[0], ALICE);
    let _s2 = open_on(&http, &nodes[1], ALICE);
    let open = |node: &Node, key: &str| {
        http.post(
            &format!("{}/v1/sandboxes", node.url),
            &json!({"engine": "subprocess"}),
            &[("authorization", &bearer(key)), HERE],
        )
    };
    let (s, r) = open(&nodes[2], ALICE);
    assert_eq!(s, 429, "{r}");
    assert_eq!(r["error"]["code"], "RATE_LIMITED", "{r}");
    let msg = r["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("max_sandboxes_per_tenant = 2"), "{msg}");
    assert!(msg.contains("in the fleet"), "{msg}");
    // Placed by the fleet, from any node: refused the same.
    let (s, r) = http.post(
        &format!("{}/v1/sandboxes", nodes[2].url),
        &json!({"engine": "subprocess"}),
        &[("authorization", &alice)],
    );
    assert_eq!(
        (s, r["error"]["code"].clone()),
        (429, json!("RATE_LIMITED")),
        "{r}"
    );
    // And through the E2B-compatible API, which opens through the same facade.
    let e2b_open = |node: &Node, key: &str| {
        http.post(
            &format!("{}/sandboxes", node.url),
            &json!({"templateID": "quick"}),
            &[("x-api-key", key)],
        )
    };
    let (s, r) = e2b_open(&nodes[2], ALICE);
    assert_eq!(s, 429, "{r}");
    let msg = r["message"].as_str().unwrap_or("");
    assert!(msg.contains("max_sandboxes_per_tenant = 2"), "{msg}");
    // Bob's caps are his own: one sandbox through the E2B API, which the fleet
    // counts, then one natively.
    let (s, r) = e2b_open(&nodes[0], BOB);
    assert_eq!(s, 201, "{r}");
    let bob_e2b = r["sandboxID"]
        .as_str()
        .expect("an E2B sandbox id")
        .to_string();
    let b1 = open_on(&http, &nodes[2], BOB);
    let (s, r) = e2b_open(&nodes[1], BOB);
    assert_eq!(s, 429, "bob holds two, one of them E2B's: {r}");
    let (s, _) = http.delete(
        &format!("{}/sandboxes/{bob_e2b}", nodes[0].url),
        &[("x-api-key", BOB)],
    );
    assert_eq!(s, 204, "killing bob's E2B sandbox");

    // Slots: alice's two sandboxes and one execution are her three; a second
    // execution is refused while it runs, on any node. (It sleeps 8 s: the check
    // comes well inside that.)
    std::thread::scope(|scope| {
        let url = format!("{}/v1/executions", nodes[0].url);
        let auth = alice.clone();
        let slow = scope
            .spawn(move || Http::default().post(&url, &sleeper("8"), &[("authorization", &auth)]));
        // Once its hold is in the bucket, the quick one is refused on any node.
        let look = Look::new(&urls, "caps");
        eventually("the slow execution's hold", Duration::from_secs(10), || {
            look.values("shares")
                .values()
                .any(|h| h["runs"].as_array().is_some_and(|r| r.len() == 1))
        });
        let (s, r) = http.post(
            &format!("{}/v1/executions", nodes[2].url),
            &json!({"program": {"command": ["true"]}}),
            &[("authorization", &alice)],
        );
        assert!(!slow.is_finished(), "the slow execution ended first");
        assert_eq!(s, 503, "{r}");
        assert_eq!(r["error"]["code"], "POOL_EXHAUSTED", "{r}");
        let msg = r["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains("max_slots_per_tenant = 3"), "{msg}");
        assert!(r["error"]["retry_after_ms"].as_u64().is_some(), "{r}");
        let (s, r) = slow.join().unwrap();
        assert_eq!(s, 200, "{r}");
    });

    // A destroyed sandbox gives its place back.
    let (s, _) = http.delete(
        &format!("{}/v1/sandboxes/{s1}", nodes[2].url),
        &[("authorization", &alice)],
    );
    assert_eq!(s, 204);
    let s3 = open_on(&http, &nodes[2], ALICE);

    // A lost node's sandboxes stop counting: alice is at her cap (s2 on q2, s3 on
    // q3); once q2 is lost, she may open another.
    let (s, r) = open(&nodes[0], ALICE);
    assert_eq!(s, 429, "{r}");
    nodes[1].kill();
    let mut last = None;
    eventually(
        "alice's sandbox on the lost node no longer counted",
        Duration::from_secs(30),
        || {
            let (s, r) = open(&nodes[0], ALICE);
            let done = s == 201;
            last = Some((s, r));
            done
        },
    );
    let (_, r) = last.unwrap();
    assert!(r["id"].is_string(), "{r}");
    // What the bucket holds: alice's two open sandboxes (s3 and the new one) and
    // bob's one; no execution.
    let holds = Look::new(&urls, "caps").values("shares");
    let mut counts: Vec<(usize, usize)> = holds
        .values()
        .map(|h| {
            let n = |k: &str| h[k].as_array().map_or(0, Vec::len);
            (n("runs"), n("sandboxes"))
        })
        .collect();
    counts.sort();
    assert_eq!(counts, vec![(0, 1), (0, 2)], "{holds:?}");
    // The sandboxes the fleet still has answer on their nodes.
    for (id, key) in [(&s3, &alice), (&b1, &bearer(BOB))] {
        let (s, r) = http.get(
            &format!("{}/v1/sandboxes/{id}", nodes[0].url),
            &[("authorization", key)],
        );
        assert_eq!(s, 200, "{id}: {r}");
    }
}
