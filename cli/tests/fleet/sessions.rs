//! Sessions on a frozen owner: a node whose process is stopped (SIGSTOP) answers
//! nothing and closes nothing, which only a process can be made to do; the other
//! session tests are the fleet's own (`fleet/tests/all/sessions.rs`).

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::harness::*;

/// An owner that stops answering without closing its connections (its process is
/// stopped: a frozen host): a call already forwarded to it, and a terminal relayed
/// to it, end once the fleet counts it lost, with `NODE_LOST` and a close; not
/// when TCP gives up, minutes later.
#[test]
fn a_call_on_a_frozen_owner_ends_when_the_fleet_counts_it_lost() {
    let nats = need_nats!();
    let _turn = turn();
    let cluster = Cluster::start(&nats, 3);
    let urls = cluster.urls();
    let dir = cluster.dir();
    let fleet = format!("{FAST}prefix = \"frozen\"\n");
    let n1 = Node::start(dir, "f1", &urls, &fleet, KEYS);
    let mut n2 = Node::start(dir, "f2", &urls, &fleet, KEYS);
    let http = Http::default();
    let a = bearer(ALICE);
    wait_up(&http, &n1, 2, &a);
    eventually("f1 knows f2's address", Duration::from_secs(30), || {
        let (_, v) = http.get(
            &format!("{}/v1/fleet", n1.url),
            &[("authorization", &bearer(ADMIN))],
        );
        v["nodes"]
            .as_array()
            .is_some_and(|n| n.iter().all(|n| n["address"].is_string()))
    });
    let id = open_on(&http, &n2, ALICE);
    let base1 = format!("{}/v1/sandboxes/{id}", n1.url);
    let (s, term) = http.post(
        &format!("{base1}/terminals"),
        &json!({"command": "sh", "size": {"rows": 24, "cols": 80}}),
        &[("authorization", &a)],
    );
    assert_eq!(s, 201, "{term}");
    let tid = term["id"].as_str().unwrap().to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut socket = rt.block_on(async {
        let path = format!("/v1/sandboxes/{id}/processes/{tid}/attach");
        let mut socket = connect(&n1.url, &path, ALICE).await;
        socket
            .send(Message::Binary(b"echo up-$((2*3))\n".to_vec().into()))
            .await
            .unwrap();
        let seen = read_until(&mut socket, true, |s| s.contains("up-6")).await;
        assert!(seen.contains("up-6"), "{seen:?}");
        socket
    });
    // A call that will be on the owner when it freezes.
    let exec_url = format!("{base1}/exec");
    let auth = a.clone();
    let call = std::thread::spawn(move || {
        let started = Instant::now();
        let answer = Http::default().post(
            &exec_url,
            &json!({"program": {"command": ["sleep", "60"]}}),
            &[("authorization", &auth)],
        );
        (answer, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(700));
    let pid = n2.pid().expect("f2 runs");
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let frozen_at = Instant::now();
    let ((s, r), took) = call.join().unwrap();
    assert_eq!(
        (s, r["error"]["code"].as_str()),
        (502, Some("NODE_LOST")),
        "{r}"
    );
    // The ack wait is 1.5 s and the heartbeat 0.2 s: seconds, where TCP would
    // have waited for minutes.
    assert!(
        took < Duration::from_secs(20),
        "the forwarded call took {took:?}"
    );
    let closed = rt.block_on(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match tokio::time::timeout_at(deadline, socket.next()).await {
                Err(_) => return None,
                Ok(Some(Ok(Message::Close(frame)))) => return Some(frame),
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(_)) | None) => return Some(None),
            }
        }
    });
    let frame = closed.expect("the relayed terminal closed within 20 s of the freeze");
    let frame = frame.expect("a close frame");
    assert_eq!(u16::from(frame.code), 1001, "{frame:?}");
    assert!(frame.reason.contains("lost"), "{frame:?}");
    assert!(frozen_at.elapsed() < Duration::from_secs(20));
    // Calls made now are answered at once.
    answer_lost(&http, &[&n1], &id, &a);
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status();
    n2.kill();
}
