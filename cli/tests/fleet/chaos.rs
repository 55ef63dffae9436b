//! Losses: a node killed with `kill -9` (and restarted), the work stream's leader
//! killed. Every accepted execution must end with exactly one result and exactly one
//! audit entry. (A node cut off from NATS is the fleet's own test,
//! `fleet/tests/all/partition.rs`.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::harness::*;

/// What a caller ended with for one key.
#[derive(Debug, Clone)]
struct Ended {
    id: String,
    status: u16,
    answer: Value,
    tries: usize,
}

/// Posts `body` with idempotency key `key` to the nodes in turn (starting at
/// `first`) until one answers with a terminal result: a result (200), or
/// `NODE_LOST` (502). A lost connection or a refusal worth retrying (503) is tried
/// again on the next node, with the same key.
fn run_to_end(
    http: &Http,
    urls: &RwLock<Vec<String>>,
    first: usize,
    key: &str,
    body: &Value,
) -> Ended {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut tries = 0;
    let mut at = first;
    loop {
        tries += 1;
        let url = {
            let urls = urls.read().unwrap();
            urls[at % urls.len()].clone()
        };
        at += 1;
        match http.send(
            "POST",
            &format!("{url}/v1/executions"),
            Some(body),
            &[("idempotency-key", key)],
        ) {
            Ok((200, answer)) => {
                return Ended {
                    id: answer["id"].as_str().unwrap_or("").to_string(),
                    status: 200,
                    answer,
                    tries,
                }
            }
            Ok((502, answer)) if answer["error"]["code"] == "NODE_LOST" => {
                return Ended {
                    id: String::new(),
                    status: 502,
                    answer,
                    tries,
                }
            }
            Ok((status, answer)) if status == 503 || status == 429 => {
                let _ = answer;
            }
            Ok((status, answer)) => panic!("key {key}: unexpected {status} {answer}"),
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "key {key}: no terminal answer in 90 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn no_accepted_execution_is_lost_or_doubled_when_a_node_and_a_leader_die() {
    let nats = need_nats!();
    let _turn = turn();
    let mut cluster = Cluster::start(&nats, 3);
    let urls = cluster.urls();
    let dir = cluster.dir().to_path_buf();
    let fleet = format!("{FAST}queue_timeout_ms = 10000\nprefix = \"chaos\"\n");
    let extra = "[pool]\nmax_size = 4\nmin_idle = 2\n";
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| Node::start(&dir, &format!("n{i}"), &urls, &fleet, extra))
        .collect();
    let http = Http::default();
    wait_up(&http, &nodes[0], 3, "");
    let look = Look::new(&urls, "chaos");
    let node_urls = Arc::new(RwLock::new(
        nodes.iter().map(|n| n.url.clone()).collect::<Vec<_>>(),
    ));

    const TOTAL: usize = 2000;
    const CALLERS: usize = 64;
    let done = Arc::new(AtomicUsize::new(0));
    let ended: Arc<parking_lot_free::Map> = Arc::default();
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let node_urls = node_urls.clone();
            let done = done.clone();
            let ended = ended.clone();
            std::thread::spawn(move || {
                let http = Http::default();
                for k in (c..TOTAL).step_by(CALLERS) {
                    // Even keys may run again elsewhere; odd ones report a lost node.
                    let loss = if k % 2 == 0 { "retry" } else { "report" };
                    let pause = 0.02 + (k % 5) as f64 * 0.02;
                    let body = json!({
                        "program": {"command": ["sh", "-c", format!("sleep {pause}; echo {k}")]},
                        "on_node_loss": loss,
                    });
                    let key = format!("chaos-{k}");
                    let e = run_to_end(&http, &node_urls, k, &key, &body);
                    ended.insert(k, e);
                    done.fetch_add(1, Ordering::AcqRel);
                }
            })
        })
        .collect();

    // The chaos: node n2 dies while it runs work, the work stream's leader dies,
    // both come back.
    let wait_done = |n: usize| {
        eventually(
            &format!("{n} executions done"),
            Duration::from_secs(120),
            || done.load(Ordering::Acquire) >= n,
        )
    };
    wait_done(TOTAL / 5);
    eventually("n2 running work", Duration::from_secs(20), || {
        !runs_on(&[&nodes[1]], "sleep").is_empty()
    });
    // Two sandboxes live on n2 when it dies.
    let sandboxes = [
        open_with(&http, &nodes[1], ""),
        open_with(&http, &nodes[1], ""),
    ];
    nodes[1].kill();
    eprintln!("killed n2 at {} done", done.load(Ordering::Acquire));
    {
        let mut u = node_urls.write().unwrap();
        u.remove(1);
    }
    // The dead node's sandboxes answer a typed error through the others.
    for id in &sandboxes {
        answer_lost(&http, &[&nodes[0], &nodes[2]], id, "");
    }
    wait_done(TOTAL * 2 / 5);
    let leader = look
        .leader("chaos_WORK_subprocess")
        .expect("the work stream's leader");
    cluster.server(&leader).kill();
    eprintln!(
        "killed the work stream's leader {leader} at {} done",
        done.load(Ordering::Acquire)
    );
    std::thread::sleep(Duration::from_secs(3));
    cluster
        .server(&leader)
        .restart()
        .expect("the leader restarts");
    wait_done(TOTAL * 3 / 5);
    nodes[1].restart();
    node_urls.write().unwrap().push(nodes[1].url.clone());
    eprintln!("restarted n2 at {} done", done.load(Ordering::Acquire));
    // Back as a new incarnation, n2 too answers NODE_LOST for what it held.
    wait_up(&http, &nodes[0], 3, "");
    answer_lost(&http, &[&nodes[1]], &sandboxes[0], "");
    for c in callers {
        c.join().expect("a caller");
    }
    // The fleet's audit, read the moment the last answer is in (no wait, no
    // retry): an answered execution is in it.
    let (status, read_at_once) = http.get(&format!("{}/v1/audit?limit=10000", nodes[0].url), &[]);
    assert_eq!(
        status, 200,
        "the audit right after the last answer: {read_at_once}"
    );
    let mut at_once: HashMap<String, usize> = HashMap::new();
    for e in read_at_once.as_array().expect("a list of entries") {
        *at_once
            .entry(e["id"].as_str().unwrap_or("").to_string())
            .or_insert(0) += 1;
    }

    // Exactly one terminal answer per key, each its own execution.
    let ended = ended.take();
    assert_eq!(ended.len(), TOTAL);
    let mut lost = 0;
    let mut ids: HashMap<String, usize> = HashMap::new();
    for (k, e) in &ended {
        match e.status {
            200 => {
                let outcome = e.answer["outcome"].as_str().unwrap_or("");
                match outcome {
                    "completed" => {
                        assert_eq!(e.answer["exit_code"], 0, "key {k}: {}", e.answer);
                        assert_eq!(e.answer["stdout"], format!("{k}\n"), "key {k}");
                    }
                    // Queued behind the loss for longer than the queue allows.
                    "timed_out" => {}
                    other => panic!("key {k}: outcome {other}: {}", e.answer),
                }
                assert!(
                    ids.insert(e.id.clone(), *k).is_none(),
                    "two keys answered by {}",
                    e.id
                );
            }
            502 => {
                assert_eq!(k % 2, 1, "key {k} asked for retry but got NODE_LOST");
                lost += 1;
            }
            _ => unreachable!(),
        }
    }
    // Every answered execution was in the audit read right after the last answer,
    // once.
    let missing: Vec<_> = ids
        .iter()
        .filter(|(id, _)| at_once.get(*id) != Some(&1))
        .map(|(id, k)| (k, id, at_once.get(id).copied().unwrap_or(0)))
        .collect();
    assert!(
        missing.is_empty(),
        "answered executions not exactly once in the audit read right after the last answer (key, id, entries): {missing:?}"
    );
    // Exactly one audit entry per execution, and none for anything else.
    let audit = look.audit_counts();
    for (id, k) in &ids {
        assert_eq!(
            audit.get(id),
            Some(&1),
            "key {k} (execution {id}): audit entries"
        );
    }
    let doubled: Vec<_> = audit.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubled.is_empty(),
        "audit entries not exactly once: {doubled:?}"
    );
    assert_eq!(
        audit.len(),
        ids.len() + lost,
        "audit entries for executions nobody accepted"
    );
    // Work of the dead node ran again elsewhere (retry), or was reported lost.
    let mut rerun = 0;
    for id in ids.keys() {
        let r = look
            .record(id)
            .expect("every answered execution has a record");
        assert_eq!(r["phase"], "done", "{r}");
        if r["attempts"].as_u64().unwrap_or(0) >= 2 {
            rerun += 1;
            assert_ne!(r["node"], "n2", "a rerun finished on the dead node: {r}");
        }
    }
    let retried_keys = ended.values().filter(|e| e.tries > 1).count();
    eprintln!(
        "chaos: {TOTAL} executions, {} completed or timed out, {lost} NODE_LOST, {rerun} run again after the node's loss, {retried_keys} callers retried on another node",
        ids.len()
    );
    assert!(
        rerun + lost > 0,
        "n2 died while it ran work, yet nothing was taken over"
    );
    drop(nodes);
    drop(cluster);
}

/// A map the callers fill, behind a mutex.
mod parking_lot_free {
    use super::Ended;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    #[derive(Default)]
    pub(super) struct Map(Mutex<BTreeMap<usize, Ended>>);

    impl Map {
        pub(super) fn insert(&self, k: usize, e: Ended) {
            let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
            assert!(m.insert(k, e).is_none(), "key {k} ended twice");
        }

        pub(super) fn take(&self) -> BTreeMap<usize, Ended> {
            std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
        }
    }
}
