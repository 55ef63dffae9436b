//! Sessions through the fleet: a sandbox opens on the node with the most room,
//! stays there, and answers every call made on any node (exec, streamed exec,
//! files, status, pause, processes, a terminal and a TCP stream over WebSockets);
//! other tenants cannot see it from any node; when its node is lost, every call on
//! it answers a typed error.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::harness::*;

/// The nodes that hold sandbox `id` themselves.
fn owners(http: &Http, nodes: &[&Node], id: &str) -> Vec<String> {
    let admin = bearer(ADMIN);
    nodes
        .iter()
        .filter(|n| {
            http.get(
                &format!("{}/v1/sandboxes/{id}", n.url),
                &[("authorization", &admin), HERE],
            )
            .0 == 200
        })
        .map(|n| n.id.clone())
        .collect()
}

const LISTENER: &str = r#"
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
print("port=%d" % s.getsockname()[1], flush=True)
c, _ = s.accept()
data = b""
while not data.endswith(b"\n"):
    more = c.recv(4096)
    if not more:
        break
    data += more
c.sendall(b"reply:" + data.strip() + b"\n")
c.close()
"#;

#[test]
fn a_sandbox_stays_on_its_node_and_answers_through_any_node() {
    let nats = need_nats!();
    let _turn = turn();
    let cluster = Cluster::start(&nats, 3);
    let urls = cluster.urls();
    let dir = cluster.dir().to_path_buf();
    // Two slots a node, any tenant's to take (not the fair share of keys).
    let extra = format!(
        "[pool]\nmax_size = 2\nmin_idle = 0\n[limiter]\nmax_slots_per_tenant = 1000\n{KEYS}"
    );
    let fleet = format!("{FAST}prefix = \"sess\"\n");
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| Node::start(&dir, &format!("s{i}"), &urls, &fleet, &extra))
        .collect();
    let http = Http::default();
    let alice = bearer(ALICE);
    let bob = bearer(BOB);
    wait_up(&http, &nodes[0], 3, &alice);

    // Placed by capacity: three sandboxes opened through s1 (two slots each) land
    // on three nodes.
    let mut placed = Vec::new();
    for _ in 0..3 {
        let (s, r) = http.post(
            &format!("{}/v1/sandboxes", nodes[0].url),
            &json!({"engine": "subprocess"}),
            &[("authorization", &alice)],
        );
        assert_eq!(s, 201, "{r}");
        let id = r["id"].as_str().unwrap().to_string();
        let refs: Vec<&Node> = nodes.iter().collect();
        let on = owners(&http, &refs, &id);
        assert_eq!(on.len(), 1, "sandbox {id} is on {on:?}");
        placed.push((id, on[0].clone()));
        // Two heartbeats, so that every node sees the new room.
        std::thread::sleep(Duration::from_millis(600));
    }
    let distinct: BTreeSet<&String> = placed.iter().map(|(_, n)| n).collect();
    assert_eq!(distinct.len(), 3, "placed: {placed:?}");

    // A sandbox on s3, used through s1 and s2.
    let id = open_on(&http, &nodes[2], ALICE);
    let (s1, s2) = (nodes[0].url.clone(), nodes[1].url.clone());
    let base1 = format!("{s1}/v1/sandboxes/{id}");
    let base2 = format!("{s2}/v1/sandboxes/{id}");
    let a = [("authorization", alice.as_str())];
    let (s, r) = http.post(
        &format!("{base1}/exec"),
        &json!({"program": {"command": ["sh", "-c", "echo $((6*7)) > answer; cat answer"]}}),
        &a,
    );
    assert_eq!((s, r["stdout"].as_str()), (200, Some("42\n")), "{r}");
    let lines = http.stream(
        &format!("{base2}/exec?stream=true"),
        &json!({"program": {"command": ["sh", "-c", "echo one; sleep 0.2; echo two"]}}),
        &a,
    );
    let kinds: Vec<&str> = lines
        .iter()
        .map(|(_, l)| l["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds.first(), Some(&"started"), "{lines:?}");
    assert!(kinds.contains(&"stdout"), "{lines:?}");
    let result = &lines.last().unwrap().1;
    assert_eq!(result["stdout"], "one\ntwo\n", "{result}");
    // The first output line came before the result: it streamed live.
    let first_out = lines.iter().find(|(_, l)| l["type"] == "stdout").unwrap().0;
    assert!(first_out + Duration::from_millis(100) < lines.last().unwrap().0);

    // Files both ways (a megabyte, in chunks), through different nodes.
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
    let (s, _) = http.raw("PUT", &format!("{base1}/files/big.bin"), data.clone(), &a);
    assert_eq!(s, 204);
    let (s, back) = http.raw("GET", &format!("{base2}/files/big.bin"), vec![], &a);
    assert_eq!(s, 200);
    assert!(
        back == data,
        "the file came back different ({} bytes)",
        back.len()
    );
    let (s, list) = http.get(&format!("{base2}/files"), &a);
    assert_eq!(s, 200);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert!(names.iter().any(|n| n.ends_with("big.bin")), "{list}");
    // Status; pause and unpause answer what the owner answers (the subprocess
    // engine has no freezer: a typed refusal, the same through any node).
    assert_eq!(http.get(&base1, &a).1["status"], "ready");
    let (s, routed) = http.post(&format!("{base2}/pause"), &json!({}), &a);
    let owner = nodes[2].url.clone();
    let (s0, direct) = http.post(
        &format!("{owner}/v1/sandboxes/{id}/pause"),
        &json!({}),
        &[("authorization", alice.as_str()), HERE],
    );
    assert_eq!((s, &routed), (s0, &direct));
    assert_eq!(
        (s, &routed["error"]["code"]),
        (400, &json!("CAPABILITY_NOT_SUPPORTED")),
        "{routed}"
    );
    let (s, _) = http.post(&format!("{base1}/unpause"), &json!({}), &a);
    assert_eq!(s, 400);
    assert_eq!(http.get(&base2, &a).1["status"], "ready");

    // A terminal and a TCP stream, over WebSockets relayed by s1 and s2.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (s, term) = http.post(
        &format!("{base1}/terminals"),
        &json!({"command": "sh", "size": {"rows": 24, "cols": 80}}),
        &a,
    );
    assert_eq!(s, 201, "{term}");
    let tid = term["id"].as_str().unwrap().to_string();
    let path = format!("/v1/sandboxes/{id}/processes/{tid}/attach");
    rt.block_on(async {
        let mut socket = connect(&s2, &path, ALICE).await;
        socket
            .send(Message::Binary(b"echo term-$((3*5))\n".to_vec().into()))
            .await
            .unwrap();
        let seen = read_until(&mut socket, true, |s| s.contains("term-15")).await;
        assert!(seen.contains("term-15"), "{seen:?}");
        socket
            .send(Message::Text(r#"{"type":"signal","signal":"KILL"}"#.into()))
            .await
            .unwrap();
        socket.close(None).await.ok();
    });
    let (s, listener) = http.post(
        &format!("{base2}/processes"),
        &json!({"argv": ["python3", "-c", LISTENER]}),
        &a,
    );
    assert_eq!(s, 201, "{listener}");
    let lid = listener["id"].as_str().unwrap().to_string();
    let (s, procs) = http.get(&format!("{base1}/processes"), &a);
    assert_eq!(s, 200);
    assert!(
        procs["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"] == lid.as_str()),
        "{procs}"
    );
    rt.block_on(async {
        let mut attach = connect(
            &s1,
            &format!("/v1/sandboxes/{id}/processes/{lid}/attach"),
            ALICE,
        )
        .await;
        let printed = read_until(&mut attach, true, |s| s.contains('\n')).await;
        let port: u16 = printed
            .trim()
            .strip_prefix("port=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the listener printed {printed:?}"));
        let mut tcp = connect(&s2, &format!("/v1/sandboxes/{id}/tcp/{port}"), ALICE).await;
        tcp.send(Message::Binary(b"through-the-fleet\n".to_vec().into()))
            .await
            .unwrap();
        let reply = read_until(&mut tcp, false, |s| s.ends_with('\n')).await;
        assert_eq!(reply, "reply:through-the-fleet\n");
    });
    // A refusal by the owner before the upgrade is the caller's plain answer: the
    // owner's own (s1 alone would say the sandbox is unknown).
    let upgrade = [
        ("authorization", alice.as_str()),
        ("connection", "Upgrade"),
        ("upgrade", "websocket"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    let (s, r) = http.get(
        &format!("{base1}/processes/no-such-process/attach"),
        &upgrade,
    );
    let mut direct_upgrade = upgrade.to_vec();
    direct_upgrade.push(HERE);
    let (s0, r0) = http.get(
        &format!("{owner}/v1/sandboxes/{id}/processes/no-such-process/attach"),
        &direct_upgrade,
    );
    assert_eq!((s, &r["error"]["code"]), (404, &json!("NOT_FOUND")), "{r}");
    assert_eq!((s, &r), (s0, &r0));
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-such-process")),
        "{r}"
    );

    // Tenant walls on every node: bob's answer for alice's sandbox is the answer
    // for an id that never existed, and the operator sees it.
    let never = "01a2299e-3e83-714b-8bc9-412c5fb1452d";
    for node in &nodes {
        let (s, r) = http.get(
            &format!("{}/v1/sandboxes/{id}", node.url),
            &[("authorization", &bob)],
        );
        let (s0, r0) = http.get(
            &format!("{}/v1/sandboxes/{never}", node.url),
            &[("authorization", &bob)],
        );
        assert_eq!(s, 404, "{}: {r}", node.id);
        assert_eq!(
            r["error"]["message"].as_str().unwrap().replace(&id, never),
            r0["error"]["message"].as_str().unwrap(),
            "{}",
            node.id
        );
        assert_eq!(s0, 404);
        let (s, r) = http.post(
            &format!("{}/v1/sandboxes/{id}/exec", node.url),
            &json!({"program": {"command": ["true"]}}),
            &[("authorization", &bob)],
        );
        assert_eq!(s, 404, "{}: {r}", node.id);
        let (s, _) = http.get(
            &format!("{}/v1/sandboxes/{id}", node.url),
            &[("authorization", &bearer(ADMIN))],
        );
        assert_eq!(s, 200, "the operator sees alice's sandbox from {}", node.id);
    }

    // Destroyed through s2: gone on every node.
    let (s, _) = http.delete(&base2, &a);
    assert_eq!(s, 204);
    for node in &nodes {
        let (s, r) = http.get(&format!("{}/v1/sandboxes/{id}", node.url), &a);
        assert_eq!(
            (s, &r["error"]["code"]),
            (409, &json!("ENGINE_DISPOSED")),
            "{}: {r}",
            node.id
        );
    }

    // The owner dies: every call on its sandbox, through the other nodes, is
    // answered at once with a typed error, and NODE_LOST once the fleet counts
    // the node lost; the restarted node answers NODE_LOST for its old sandboxes.
    let doomed = open_on(&http, &nodes[2], ALICE);
    nodes[2].kill();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen_codes = BTreeSet::new();
    loop {
        for node in &nodes[..2] {
            let asked = Instant::now();
            let (s, r) = http.post(
                &format!("{}/v1/sandboxes/{doomed}/exec", node.url),
                &json!({"program": {"command": ["true"]}}),
                &a,
            );
            let took = asked.elapsed();
            let code = r["error"]["code"].as_str().unwrap_or("").to_string();
            assert!(
                matches!(
                    (s, code.as_str()),
                    (502, "NODE_LOST") | (503, "FLEET_UNAVAILABLE")
                ),
                "{}: {s} {r}",
                node.id
            );
            assert!(took < Duration::from_secs(15), "answered after {took:?}");
            seen_codes.insert(code);
        }
        if seen_codes.contains("NODE_LOST") || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(seen_codes.contains("NODE_LOST"), "{seen_codes:?}");
    nodes[2].restart();
    wait_up(&http, &nodes[0], 3, &alice);
    for node in &nodes {
        let (s, r) = http.get(&format!("{}/v1/sandboxes/{doomed}", node.url), &a);
        assert_eq!(
            (s, &r["error"]["code"]),
            (502, &json!("NODE_LOST")),
            "{}: {r}",
            node.id
        );
    }
    drop(nodes);
    drop(cluster);
}
