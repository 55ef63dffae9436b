//! 100 executions in parallel, each on its own connection.

use std::collections::HashSet;
use std::time::Duration;

use paddock::PaddockConfig;
use paddock_pool::PoolConfig;
use serde_json::json;

use crate::http::client::post_json;
use crate::http::support::{server_config, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_parallel_executions_each_get_their_own_output() {
    // Eight instances and a queue longer than the burst, with a generous wait: no
    // request may be refused, so every one must answer 200 with its own output.
    let config = PaddockConfig {
        pool: PoolConfig {
            max_size: 8,
            max_waiting: 1024,
            acquire_timeout_ms: 30_000,
            ..PoolConfig::default()
        },
        ..PaddockConfig::default()
    };
    let t = TestServer::start_config(config, server_config());
    let tasks: Vec<_> = (0..100)
        .map(|n| {
            let addr = t.addr;
            let body = json!({
                "program": {"command": ["sh", "-c", "echo \"$0\"", format!("n{n}")]},
                "limits": {"timeout_ms": 20000}
            });
            tokio::spawn(async move { (n, post_json(addr, "/v1/executions", &body).await) })
        })
        .collect();
    let mut ids = HashSet::new();
    for task in tasks {
        let (n, r) = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("every request is answered")
            .unwrap();
        let v = r.expect(200);
        assert_eq!(v["outcome"], "completed", "request {n}: {v}");
        assert_eq!(v["stdout"], format!("n{n}\n"), "request {n}: {v}");
        assert!(
            ids.insert(v["id"].as_str().unwrap().to_string()),
            "duplicate id"
        );
    }
    assert_eq!(ids.len(), 100);
    let stats = crate::http::client::get(t.addr, "/v1/stats")
        .await
        .expect(200);
    assert_eq!(stats["audit"]["total"], 100, "{stats}");
    assert_eq!(stats["audit"]["success"], 100, "{stats}");
    t.stop().await;
}
