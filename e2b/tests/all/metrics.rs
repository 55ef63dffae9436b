//! Sandbox metrics (`GET /sandboxes/{id}/metrics`, `GET /sandboxes/metrics`): what
//! the sampler read of a sandbox's cgroup and disk while a program kept a CPU busy,
//! the time range, the batch of latest samples, and their refusals.

use std::time::{Duration, SystemTime};

use paddock_e2b::TemplateConfig;
use serde_json::{json, Value};

use crate::live::{envelope, open, send, E2bServer, Req, ALICE, BOB};

fn get(path: &str, key: &str) -> Req {
    Req::new("GET", path).header("x-api-key", key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_sample_cpu_memory_and_disk_within_the_range_asked() {
    let t = E2bServer::start(64, &[("base", TemplateConfig::default())]);
    let created = t.create(ALICE, "base", json!({})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let opened_at = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // A program that keeps one CPU busy for 7 s, across at least one sampling.
    let busy = json!({"process": {"cmd": "sh", "args": [
        "-c",
        "end=$(($(date +%s) + 7)); i=0; while :; do i=$((i + 1)); \
         if [ $((i % 20000)) -eq 0 ] && [ $(date +%s) -ge $end ]; then break; fi; done"
    ]}});
    let running = open(
        t.addr,
        Req::new("POST", "/process.Process/Start")
            .body("application/connect+json", envelope(&busy))
            .at_port(&id, "49983")
            .header("x-access-token", &token),
    )
    .await;
    assert_eq!(running.status().as_u16(), 200);
    // Its events, read as they come (the start, then the end).
    let events = tokio::spawn(async move {
        use http_body_util::BodyExt;
        let mut body = running.into_body();
        let mut got = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            got.extend_from_slice(&frame.into_data().unwrap_or_default());
        }
        String::from_utf8_lossy(&got).into_owned()
    });

    let path = format!("/sandboxes/{id}/metrics");
    let mut samples: Vec<Value> = Vec::new();
    for _ in 0..150 {
        let a = send(t.addr, get(&path, ALICE)).await;
        assert_eq!(a.status, 200, "{}", a.text());
        samples = a.json().as_array().unwrap().clone();
        if samples
            .iter()
            .any(|s| s["cpuUsedPct"].as_f64().unwrap() >= 20.0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !samples
        .iter()
        .any(|s| s["cpuUsedPct"].as_f64().unwrap() >= 20.0)
    {
        events.abort();
        panic!(
            "a busy CPU shows within 15 s: {samples:?}; the program said {:?}",
            events.await
        );
    }
    let mut last = 0;
    for s in &samples {
        let at = s["timestampUnix"].as_u64().unwrap();
        assert!(at >= opened_at && at >= last, "{s}");
        last = at;
        assert!(s["cpuCount"].as_u64().unwrap() >= 1, "{s}");
        let pct = s["cpuUsedPct"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&pct), "{s}");
        let (used, total) = (
            s["memUsed"].as_u64().unwrap(),
            s["memTotal"].as_u64().unwrap(),
        );
        assert!(used > 0 && used <= total, "{s}");
        assert!(s["memCache"].as_u64().unwrap() <= used, "{s}");
        let (disk, disk_total) = (
            s["diskUsed"].as_u64().unwrap(),
            s["diskTotal"].as_u64().unwrap(),
        );
        assert!(disk_total > 0 && disk <= disk_total, "{s}");
        assert!(s["timestamp"].as_str().unwrap().ends_with('Z'), "{s}");
    }
    events.abort();

    // The range, in Unix seconds, both ends included.
    let at = samples[0]["timestampUnix"].as_u64().unwrap();
    let a = send(t.addr, get(&format!("{path}?start={at}&end={at}"), ALICE)).await;
    let within = a.json();
    assert!(!within.as_array().unwrap().is_empty(), "{within}");
    assert!(within
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["timestampUnix"] == at));
    let before = opened_at - 3600;
    let a = send(
        t.addr,
        get(
            &format!("{path}?start={before}&end={}", before + 1800),
            ALICE,
        ),
    )
    .await;
    assert_eq!((a.status, a.json()), (200, json!([])));
    for bad in ["?start=10&end=5", "?start=soon", "?end=-1"] {
        let a = send(t.addr, get(&format!("{path}{bad}"), ALICE)).await;
        assert_eq!(a.status, 400, "{bad}: {}", a.text());
        assert_eq!(a.json()["code"], 400, "{bad}: in E2B's shape: {}", a.text());
    }

    // The latest of each named sandbox the caller may see.
    let a = send(
        t.addr,
        get(&format!("/sandboxes/metrics?sandbox_ids={id},nope"), ALICE),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let found = a.json()["sandboxes"].as_object().unwrap().clone();
    assert_eq!(found.keys().collect::<Vec<_>>(), vec![&id], "{found:?}");
    assert!(found[&id]["memUsed"].as_u64().unwrap() > 0);
    let a = send(t.addr, get("/sandboxes/metrics", ALICE)).await;
    assert_eq!(a.status, 400, "{}", a.text());
    let many = (0..101)
        .map(|i| format!("s{i}"))
        .collect::<Vec<_>>()
        .join(",");
    let a = send(
        t.addr,
        get(&format!("/sandboxes/metrics?sandbox_ids={many}"), ALICE),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text());

    // Another tenant's: not there; a killed sandbox's: gone.
    let a = send(t.addr, get(&path, BOB)).await;
    assert_eq!(a.status, 404, "{}", a.text());
    let a = send(
        t.addr,
        Req::new("DELETE", &format!("/sandboxes/{id}")).header("x-api-key", ALICE),
    )
    .await;
    assert_eq!(a.status, 204, "{}", a.text());
    let a = send(t.addr, get(&path, ALICE)).await;
    assert_eq!(a.status, 404, "{}", a.text());
    t.stop().await;
}
