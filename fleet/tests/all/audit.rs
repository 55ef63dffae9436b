//! The fleet's audit is read-your-writes: an answered execution is in the audit the
//! moment its answer arrives, read on any node; an execution whose entry the audit
//! stream does not take is not answered with its result.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::harness::*;

/// How many entries each execution id has in the fleet's audit, read through
/// `node`'s `GET /v1/audit` (newest first, at most `limit`), once.
fn audit_on(http: &Http, node: &Node, limit: usize) -> HashMap<String, usize> {
    let (status, entries) = http.get(&format!("{}/v1/audit?limit={limit}", node.url), &[]);
    assert_eq!(status, 200, "GET /v1/audit on {}: {entries}", node.id);
    let mut counts = HashMap::new();
    for e in entries.as_array().expect("a list of entries") {
        *counts
            .entry(e["id"].as_str().unwrap_or("").to_string())
            .or_insert(0) += 1;
    }
    counts
}

/// Makes the audit stream `P_AUDIT` refuse every new entry (`refuse`: entries
/// larger than a few bytes are refused, which every entry is, before the servers
/// look at its message id), or take them again. A refusal is in force once a
/// probe is refused (the new limit may reach the stream's leader a moment after
/// the update is answered).
fn audit_refuses(urls: &[String], prefix: &str, refuse: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let client = async_nats::connect(urls).await.expect("NATS");
        let js = async_nats::jetstream::new(client);
        let mut stream = js
            .get_stream(format!("{prefix}_AUDIT"))
            .await
            .expect("the audit stream");
        let mut config = stream.info().await.expect("its info").config.clone();
        config.max_message_size = if refuse { 16 } else { -1 };
        js.update_stream(config)
            .await
            .expect("the audit stream's new limit");
        if !refuse {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let probe = js
                .publish(
                    format!("{prefix}.audit.probe"),
                    "a probe larger than the limit".into(),
                )
                .await
                .expect("a probe sent");
            if probe.await.is_err() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the audit stream still takes entries"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

#[test]
fn an_answered_execution_is_in_the_audit_at_once_and_none_is_answered_unaudited() {
    let nats = need_nats!();
    let _turn = turn();
    let cluster = Cluster::start(&nats, 3);
    let urls = cluster.urls();
    let dir = cluster.dir();
    let fleet = format!("{FAST}prefix = \"ryw\"\n");
    let extra = "[pool]\nmax_size = 2\nmin_idle = 1\n";
    let nodes: Vec<Node> = (1..=3)
        .map(|i| Node::start(dir, &format!("y{i}"), &urls, &fleet, extra))
        .collect();
    let http = Http::default();
    wait_up(&http, &nodes[0], 3, "");

    // Accepted on one node (run on any), read on the next at once: there.
    for i in 0..60 {
        let (at, read) = (&nodes[i % 3], &nodes[(i + 1) % 3]);
        let (status, r) = http.post(
            &format!("{}/v1/executions", at.url),
            &json!({"program": {"command": ["echo", format!("{i}")]}}),
            &[],
        );
        assert_eq!(status, 200, "{r}");
        let id = r["id"].as_str().unwrap();
        let audit = audit_on(&http, read, 20);
        assert_eq!(
            audit.get(id),
            Some(&1),
            "execution {i} ({id}), answered by {}, in the audit read on {} right after",
            at.id,
            read.id
        );
    }

    // The audit stream refuses new entries: the execution runs, and its caller
    // gets FLEET_UNAVAILABLE naming it, not a result the audit lacks.
    audit_refuses(&urls, "ryw", true);
    let body = json!({"program": {"command": ["sh", "-c", "echo $$-$(date +%s%N)"]}});
    let key = [("idempotency-key", "ryw-1")];
    let started = Instant::now();
    let (status, refused) = http.post(&format!("{}/v1/executions", nodes[0].url), &body, &key);
    let took = started.elapsed();
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (503, Some("FLEET_UNAVAILABLE")),
        "an execution whose audit entry the stream refuses: {refused}"
    );
    let message = refused["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("audit entry"), "{message}");
    let id = message
        .split_whitespace()
        .nth(1)
        .expect("the message names the execution")
        .to_string();
    assert!(took < Duration::from_secs(30), "refused after {took:?}");
    eprintln!("answered FLEET_UNAVAILABLE after {took:?}: {message}");
    assert_eq!(audit_on(&http, &nodes[1], 100).get(&id), None);
    // Its result is kept, not handed out: a lookup is refused alike meanwhile.
    let (status, looked) = http.get(&format!("{}/v1/executions/{id}", nodes[1].url), &[]);
    assert_eq!(status, 503, "a lookup while the audit refuses: {looked}");

    // The stream takes entries again: the result is answered, audited once, and a
    // retry with the key answers the same run.
    audit_refuses(&urls, "ryw", false);
    let (status, found) = http.get(&format!("{}/v1/executions/{id}", nodes[2].url), &[]);
    assert_eq!(status, 200, "{found}");
    let stdout = found["stdout"].clone();
    assert_ne!(stdout, Value::Null, "{found}");
    assert_eq!(audit_on(&http, &nodes[0], 100).get(&id), Some(&1));
    let (status, again) = http.post(&format!("{}/v1/executions", nodes[1].url), &body, &key);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"].as_str(), Some(id.as_str()), "{again}");
    assert_eq!(again["stdout"], stdout, "the key's retry ran it again");
    let audit = audit_on(&http, &nodes[2], 1000);
    assert_eq!(audit.get(&id), Some(&1));
    assert!(audit.values().all(|n| *n == 1), "{audit:?}");
    assert_eq!(audit.len(), 61, "{audit:?}");
}
