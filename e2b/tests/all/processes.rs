//! One process table per sandbox, whichever API starts the process: E2B's process
//! service and the native routes list the same processes, an E2B pid names the
//! session's process number, and `pool.max_processes_per_sandbox` holds across both.

use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use paddock_e2b::TemplateConfig;
use serde_json::{json, Value};

use crate::live::{envelope, open, send, E2bServer, Req, ALICE, BOB};

/// A unary call of the process service of sandbox `id`.
fn process(id: &str, token: &str, method: &str, body: Value) -> Req {
    Req::new("POST", &format!("/process.Process/{method}"))
        .json(&body)
        .at_port(id, "49983")
        .header("x-access-token", token)
}

/// Starts `sleep 30` tagged `tag` through E2B's `Start`, leaves its stream after the
/// first event, and answers the pid that event gave, or the Connect error code.
async fn e2b_start(t: &E2bServer, id: &str, token: &str, tag: &str) -> Result<u64, String> {
    let request = json!({"process": {"cmd": "sleep", "args": ["30"]}, "tag": tag});
    let answer = open(
        t.addr,
        Req::new("POST", "/process.Process/Start")
            .body("application/connect+json", envelope(&request))
            .at_port(id, "49983")
            .header("x-access-token", token),
    )
    .await;
    let status = answer.status().as_u16();
    let mut body = answer.into_body();
    let mut buf = Vec::<u8>::new();
    let first = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if buf.len() >= 5 {
                let n = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
                if buf.len() >= 5 + n {
                    let v: Value = serde_json::from_slice(&buf[5..5 + n]).unwrap();
                    return (buf[0], v);
                }
            }
            match body.frame().await {
                Some(Ok(frame)) => buf.extend_from_slice(&frame.into_data().unwrap_or_default()),
                other => panic!("the stream ended with {other:?} after {buf:?} (status {status})"),
            }
        }
    })
    .await
    .expect("a first event within 20 s");
    match first {
        (0, v) => Ok(v["event"]["start"]["pid"].as_u64().expect("a start event")),
        (_, v) => Err(v["error"]["code"].as_str().unwrap_or_default().to_string()),
    }
}

/// Starts `sleep 30` tagged `tag` through the native API: the answer's status and body.
async fn native_start(t: &E2bServer, id: &str, tag: &str) -> (u16, Value) {
    let r = send(
        t.addr,
        Req::new("POST", &format!("/v1/sandboxes/{id}/processes"))
            .header("authorization", &format!("Bearer {ALICE}"))
            .json(&json!({"argv": ["sleep", "30"], "tag": tag})),
    )
    .await;
    (r.status, r.json())
}

/// The running processes E2B's `List` shows: (pid, tag).
async fn e2b_list(t: &E2bServer, id: &str, token: &str) -> Vec<(u64, String)> {
    let r = send(t.addr, process(id, token, "List", json!({}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let mut seen: Vec<(u64, String)> = r.json()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["config"]["cmd"], "sleep", "{p}");
            assert_eq!(p["config"]["args"], json!(["30"]), "{p}");
            (
                p["pid"].as_u64().unwrap(),
                p["tag"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_apis_share_one_process_table_and_its_cap() {
    let t = E2bServer::start_with(256, &[("base", TemplateConfig::default())], |c| {
        c.pool.max_processes_per_sandbox = 3;
    });
    let created = t.create(ALICE, "base", json!({})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();

    // One from each API: E2B's pid is the session's process number from 1000 on.
    assert_eq!(e2b_start(&t, &id, &token, "from-e2b").await, Ok(1000));
    let (status, native) = native_start(&t, &id, "from-native").await;
    assert_eq!(status, 201, "{native}");
    assert_eq!(
        (native["number"].as_u64(), native["tag"].as_str()),
        (Some(2), Some("from-native"))
    );
    assert_eq!(
        e2b_list(&t, &id, &token).await,
        [
            (1000, "from-e2b".to_string()),
            (1001, "from-native".to_string())
        ]
    );
    let r = send(
        t.addr,
        Req::new("GET", &format!("/v1/sandboxes/{id}/processes"))
            .header("authorization", &format!("Bearer {ALICE}")),
    )
    .await;
    let listed: Vec<(u64, String)> = r.json()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["number"].as_u64().unwrap(),
                p["tag"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(listed, [(1, "from-e2b".into()), (2, "from-native".into())]);
    // The other tenant finds neither the sandbox nor its processes.
    let r = send(
        t.addr,
        Req::new("GET", &format!("/v1/sandboxes/{id}/processes"))
            .header("authorization", &format!("Bearer {BOB}")),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());

    // The third fills the cap; a fourth is refused on either API.
    assert_eq!(e2b_start(&t, &id, &token, "third").await, Ok(1002));
    assert_eq!(
        e2b_start(&t, &id, &token, "fourth").await,
        Err("resource_exhausted".to_string())
    );
    let (status, refused) = native_start(&t, &id, "fourth").await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (429, Some("RATE_LIMITED")),
        "{refused}"
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("pool.max_processes_per_sandbox"),
        "{refused}"
    );

    // E2B ends the native API's process by its pid, by tag; its place comes back.
    let r = send(
        t.addr,
        process(
            &id,
            &token,
            "SendSignal",
            json!({"process": {"tag": "from-native"}, "signal": "SIGNAL_SIGKILL"}),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        match e2b_start(&t, &id, &token, "after").await {
            Ok(pid) => break pid,
            Err(code) if code == "resource_exhausted" && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(code) => panic!("no place came back within 10 s: {code}"),
        }
    };
    // Refused starts took no number: the fourth process is number 4.
    assert_eq!(pid, 1003);
    assert_eq!(
        e2b_list(&t, &id, &token).await,
        [
            (1000, "from-e2b".to_string()),
            (1002, "third".to_string()),
            (1003, "after".to_string())
        ]
    );
    // A pid the sandbox never gave is not found.
    let r = send(
        t.addr,
        process(
            &id,
            &token,
            "SendSignal",
            json!({"process": {"pid": 999}, "signal": "SIGNAL_SIGKILL"}),
        ),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());
    t.stop().await;
}

/// When its sandbox is killed, a process's event stream ends as E2B's does when the
/// sandbox goes: the connection drops, with neither an `end` event nor the end of
/// the stream (the SDK then finds the sandbox gone and says it was killed), and the
/// sandbox's agent answers E2B's 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sandboxs_streams_drop() {
    let t = E2bServer::start(256, &[("base", TemplateConfig::default())]);
    let created = t.create(ALICE, "base", json!({})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let request = json!({"process": {"cmd": "sleep", "args": ["30"]}});
    let answer = open(
        t.addr,
        Req::new("POST", "/process.Process/Start")
            .body("application/connect+json", envelope(&request))
            .at_port(&id, "49983")
            .header("x-access-token", &token),
    )
    .await;
    assert_eq!(answer.status().as_u16(), 200);
    // Frames as they come; then how the body ended: `Ok` a clean end, `Err` a drop.
    let (tx, mut frames) = tokio::sync::mpsc::unbounded_channel::<Result<(u8, Value), String>>();
    tokio::spawn(async move {
        let mut body = answer.into_body();
        let mut buf = Vec::<u8>::new();
        loop {
            match body.frame().await {
                Some(Ok(frame)) => buf.extend_from_slice(&frame.into_data().unwrap_or_default()),
                Some(Err(e)) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
                None => {
                    let _ = tx.send(Err("a clean end".into()));
                    return;
                }
            }
            while buf.len() >= 5 {
                let n = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
                if buf.len() < 5 + n {
                    break;
                }
                let v: Value = serde_json::from_slice(&buf[5..5 + n]).unwrap_or(Value::Null);
                let _ = tx.send(Ok((buf[0], v)));
                buf.drain(..5 + n);
            }
        }
    });
    let first = next(&mut frames).await.expect("a frame");
    assert!(first.1["event"]["start"].is_object(), "{first:?}");
    let r = send(
        t.addr,
        Req::new("DELETE", &format!("/sandboxes/{id}")).header("x-api-key", ALICE),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let ended = loop {
        match next(&mut frames).await {
            Ok((_, v)) if v["event"]["keepalive"].is_object() => continue,
            Ok(frame) => panic!("a frame after the kill: {frame:?}"),
            Err(how) => break how,
        }
    };
    assert_ne!(ended, "a clean end", "the connection drops");
    // What the SDK asks next, whether the sandbox runs: E2B's 502.
    let r = send(
        t.addr,
        Req::new("GET", "/health")
            .at_port(&id, "49983")
            .header("x-access-token", &token),
    )
    .await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["message"], "The sandbox was not found");
    t.stop().await;
}

/// The next item of a stream (within 20 s).
async fn next<T>(frames: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), frames.recv())
        .await
        .expect("a frame within 20 s")
        .expect("the stream goes on")
}
