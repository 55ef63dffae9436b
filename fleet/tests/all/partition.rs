//! A node cut off from NATS: what it ran is taken over by the others once its
//! lease is over, and it stops it; every accepted execution ends with exactly one
//! result and exactly one audit entry.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::*;

#[test]
fn a_node_cut_off_from_nats_stops_what_it_no_longer_owns() {
    let nats = need_nats!();
    let _turn = turn();
    // Three JetStream servers, and p1 without: `a` reaches NATS through p1 only, so
    // stopping p1 cuts `a` off and leaves every stream's replicas alone.
    let mut cluster = Cluster::start_with(&nats, 3, 1);
    let urls = cluster.urls();
    let dir = cluster.dir().to_path_buf();
    let extra = "[pool]\nmax_size = 2\nmin_idle = 0\n";
    let fleet = format!("{FAST}prefix = \"part\"\n");
    // `a` has a third instance, which its sandbox holds: it takes two runs.
    let a = Node::start(
        &dir,
        "a",
        &urls[3..4],
        &format!("{fleet}discover_servers = false\n"),
        "[pool]\nmax_size = 3\nmin_idle = 0\n",
    );
    let http = Http::default();
    let sandbox = open_with(&http, &a, "");
    assert_eq!(
        http.get(&format!("{}/v1/stats", a.url), &[]).1["scheduler"]["sandboxes"],
        1
    );
    let b = Node::start(&dir, "b", &urls[1..2], &fleet, extra);
    let c = Node::start(&dir, "c", &urls[2..3], &fleet, extra);
    wait_up(&http, &b, 3, "");
    let look = Look::new(&urls[..3], "part");
    // Six 5-second sleeps on six slots: two of them run on `a`.
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let url = if i % 2 == 0 { b.url.clone() } else { c.url.clone() };
            std::thread::spawn(move || {
                Http::default().post(
                    &format!("{url}/v1/executions"),
                    &json!({"program": {"command": ["sh", "-c", format!("sleep 5; echo {i}")]}, "on_node_loss": "retry"}),
                    &[],
                )
            })
        })
        .collect();
    eventually("two sleeps on a", Duration::from_secs(15), || {
        count(&a, "sleep 5") == 2
    });
    let started = Instant::now();
    cluster.server("p1").kill();
    // Its lease cannot be renewed: `a` stops its runs once the lease is over.
    eventually("a's runs stopped", Duration::from_secs(10), || {
        count(&a, "sleep 5") == 0
    });
    let stopped_after = started.elapsed();
    assert!(
        stopped_after < Duration::from_secs(5),
        "a stopped its runs only after {stopped_after:?}, when they would have ended anyway"
    );
    // While `a` is away, `b` and `c` take its two over (once their own are done).
    let mut results = BTreeMap::new();
    for (i, call) in calls.into_iter().enumerate() {
        let (status, r) = call.join().expect("a caller");
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["exit_code"], 0, "{r}");
        assert_eq!(r["stdout"], format!("{i}\n"));
        results.insert(r["id"].as_str().unwrap().to_string(), r);
    }
    // The two that were on `a` ran again on `b` or `c`; every one has one entry.
    let audit = look.audit_counts();
    let mut moved = 0;
    for id in results.keys() {
        assert_eq!(audit.get(id), Some(&1), "{id}");
        let rec = look.record(id).unwrap();
        if rec["attempts"] == 2 {
            moved += 1;
            assert_ne!(rec["node"], "a", "{rec}");
        }
    }
    assert_eq!(moved, 2, "the two runs of the cut-off node were taken over");
    // Cut off for longer than the ack wait, `a` ended its sandbox: the fleet
    // counts it lost.
    eventually("a ended its sandbox", Duration::from_secs(15), || {
        http.get(&format!("{}/v1/stats", a.url), &[]).1["scheduler"]["sandboxes"] == 0
    });
    answer_lost(&http, &[&b, &c], &sandbox, "");
    // `a` comes back, into the fleet, with nothing of its own left to run, and
    // answers for its old sandbox as the others do.
    cluster.server("p1").restart().expect("p1 restarts");
    wait_up(&http, &b, 3, "");
    assert_eq!(count(&a, "sleep 5"), 0);
    answer_lost(&http, &[&a, &b, &c], &sandbox, "");
    let (s, r) = http.post(
        &format!("{}/v1/executions", a.url),
        &json!({"program": {"command": ["echo", "back"]}}),
        &[],
    );
    assert_eq!((s, r["stdout"].as_str()), (200, Some("back\n")), "{r}");
}

fn count(node: &Node, needle: &str) -> usize {
    count_running(&[node], needle)
}
