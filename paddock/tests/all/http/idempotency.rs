//! `Idempotency-Key`: a repeated key never runs the program twice.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::http::client::{get, Request};
use crate::http::support::{server_config, TestServer};

/// A program with a side effect: it appends a line to `counter`, waits, and prints
/// how many lines the file has.
fn counting(counter: &Path, pause: &str) -> Value {
    json!({
        "program": {"command": ["sh", "-c",
            format!("echo x >> \"$COUNTER\"; sleep {pause}; wc -l < \"$COUNTER\" | tr -d ' '")]},
        "env": {"COUNTER": counter.to_str().unwrap()}
    })
}

fn lines(counter: &Path) -> usize {
    std::fs::read_to_string(counter)
        .unwrap_or_default()
        .lines()
        .count()
}

fn keyed(key: &str, body: &Value) -> Request {
    Request::post("/v1/executions")
        .header("Idempotency-Key", key)
        .json(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_with_one_key_run_once() {
    let t = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    let body = counting(&counter, "0.5");

    let send = || {
        let (req, addr) = (keyed("order-1", &body), t.addr);
        tokio::spawn(async move { req.send(addr).await })
    };
    let (a, b) = (send(), send());
    let (a, b) = (a.await.unwrap().expect(200), b.await.unwrap().expect(200));
    assert_eq!(a, b, "both answers are the one execution's");
    assert_eq!(a["outcome"], "completed", "{a}");
    assert_eq!(a["stdout"], "1\n", "{a}");
    assert_eq!(lines(&counter), 1, "the program ran once");

    // Repeated later: the first answer again, still without running.
    let c = keyed("order-1", &body).send(t.addr).await.expect(200);
    assert_eq!(c, a);
    assert_eq!(lines(&counter), 1);
    let id = a["id"].as_str().unwrap();
    assert_eq!(
        get(t.addr, &format!("/v1/executions/{id}"))
            .await
            .expect(200),
        a
    );

    // Another key runs; the same key of another tenant is that tenant's own.
    let d = keyed("order-2", &body).send(t.addr).await.expect(200);
    assert_eq!(d["stdout"], "2\n", "{d}");
    assert_ne!(d["id"], a["id"]);
    let e = keyed("order-1", &body)
        .header("X-Paddock-Tenant", "someone-else")
        .send(t.addr)
        .await
        .expect(200);
    assert_eq!(e["stdout"], "3\n", "{e}");
    assert_eq!(lines(&counter), 3);
    // Without a key, every request runs.
    let f = Request::post("/v1/executions")
        .json(&body)
        .send(t.addr)
        .await
        .expect(200);
    assert_eq!(f["stdout"], "4\n", "{f}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_retried_after_the_client_went_away_gets_the_first_result() {
    let t = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    let body = counting(&counter, "1");

    // The first caller gives up (closes its connection) while the program runs.
    let first = {
        let req = keyed("retry-1", &body);
        let addr = t.addr;
        tokio::spawn(async move { req.send(addr).await })
    };
    let paddock = t.paddock.clone();
    crate::http::support::eventually(Duration::from_secs(10), "the execution to start", || {
        let paddock = paddock.clone();
        async move { paddock.stats().await.unwrap().in_flight == 1 }
    })
    .await;
    first.abort();
    let _ = first.await;

    // Its retry gets the one execution's answer.
    let r = keyed("retry-1", &body).send(t.addr).await.expect(200);
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["stdout"], "1\n", "{r}");
    let again = keyed("retry-1", &body).send(t.addr).await.expect(200);
    assert_eq!(again, r);
    assert_eq!(lines(&counter), 1, "the program ran once");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_retried_after_a_stream_reader_went_away_gets_the_first_result() {
    let t = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    // Output keeps coming after the caller hangs up, so the server notices.
    let body = counting(
        &counter,
        "0.2; echo a; sleep 0.2; echo b; sleep 0.2; echo c; sleep 0.2",
    );

    // The first caller streams, reads the start, and hangs up mid-run.
    let (s, id) = crate::http::support::open_stream_with(
        t.addr,
        Request::post("/v1/executions?stream=true")
            .header("Idempotency-Key", "stream-retry")
            .json(&body),
    )
    .await;
    let paddock = t.paddock.clone();
    crate::http::support::eventually(Duration::from_secs(10), "the execution to start", || {
        let paddock = paddock.clone();
        async move { paddock.stats().await.unwrap().in_flight == 1 }
    })
    .await;
    drop(s);
    crate::http::support::eventually(Duration::from_secs(10), "the execution to end", || {
        let paddock = paddock.clone();
        async move { paddock.stats().await.unwrap().in_flight == 0 }
    })
    .await;
    assert_eq!(lines(&counter), 1, "the execution ran to its end");

    // The result is kept under the id and the key all the same.
    let kept = get(t.addr, &format!("/v1/executions/{id}"))
        .await
        .expect(200);
    assert_eq!(kept["outcome"], "completed", "{kept}");
    assert_eq!(kept["stdout"], "a\nb\nc\n1\n", "{kept}");
    let r = keyed("stream-retry", &body).send(t.addr).await.expect(200);
    assert_eq!(r, kept);
    assert_eq!(lines(&counter), 1, "the program ran once");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_and_keys_are_kept_for_the_retention_only() {
    let mut server = server_config();
    server.result_retention_s = 1;
    let t = TestServer::start_with(paddock::builder(), server);
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    let body = counting(&counter, "0");

    let first = keyed("daily", &body).send(t.addr).await.expect(200);
    assert_eq!(first["stdout"], "1\n", "{first}");
    let path = format!("/v1/executions/{}", first["id"].as_str().unwrap());
    assert_eq!(get(t.addr, &path).await.expect(200), first);
    assert_eq!(keyed("daily", &body).send(t.addr).await.expect(200), first);

    tokio::time::sleep(Duration::from_millis(1300)).await;
    get(t.addr, &path).await.expect_error(404, "NOT_FOUND");
    let again = keyed("daily", &body).send(t.addr).await.expect(200);
    assert_eq!(
        again["stdout"], "2\n",
        "past the retention the key runs anew: {again}"
    );
    assert_ne!(again["id"], first["id"]);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_wrong_in_itself_does_not_take_its_key() {
    let t = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    let mut wrong = counting(&counter, "0");
    wrong["limits"] = json!({"timeout_ms": 0});
    for stream in [false, true] {
        let key = format!("fixed-{stream}");
        let path = if stream {
            "/v1/executions?stream=true"
        } else {
            "/v1/executions"
        };
        let r = Request::post(path)
            .header("Idempotency-Key", &key)
            .json(&wrong)
            .send(t.addr)
            .await;
        r.expect_error(400, "INVALID_OPTIONS");
        // Corrected, with the same key: it runs.
        let r = keyed(&key, &counting(&counter, "0")).send(t.addr).await;
        assert_eq!(r.expect(200)["outcome"], "completed");
    }
    assert_eq!(lines(&counter), 2, "each corrected request ran once");
    t.stop().await;
}
