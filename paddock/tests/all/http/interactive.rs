//! Background processes, terminals and TCP streams over HTTP: the JSON routes and the
//! WebSocket attach and TCP routes, driven by a real WebSocket client.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::http::client::{get, post_json, Request};
use crate::http::support::TestServer;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const PATIENCE: Duration = Duration::from_secs(20);

async fn open_sandbox(addr: SocketAddr) -> String {
    let r = post_json(
        addr,
        "/v1/sandboxes",
        &json!({"engine": "subprocess", "network": "none"}),
    )
    .await
    .expect(201);
    r["id"].as_str().expect("id").to_string()
}

async fn connect(addr: SocketAddr, path: &str) -> Socket {
    let (socket, response) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
        .await
        .unwrap_or_else(|e| panic!("upgrade of {path}: {e}"));
    assert_eq!(response.status().as_u16(), 101);
    socket
}

/// What an attach socket delivered: output by stream tag, text messages, and whether
/// the server closed it.
#[derive(Default, Debug)]
struct Seen {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    texts: Vec<Value>,
    closed: bool,
}

impl Seen {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Reads until `done(&seen)` holds (or the socket closes); panics after [`PATIENCE`].
async fn read_until(socket: &mut Socket, seen: &mut Seen, done: impl Fn(&Seen) -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done(seen) {
        let next = tokio::time::timeout_at(deadline, socket.next())
            .await
            .unwrap_or_else(|_| panic!("waited {PATIENCE:?}; got {seen:?}"));
        match next {
            Some(Ok(Message::Binary(b))) => match b.first() {
                Some(1) => seen.stdout.extend_from_slice(&b[1..]),
                Some(2) => seen.stderr.extend_from_slice(&b[1..]),
                other => panic!("an output message must start with a stream tag; got {other:?}"),
            },
            Some(Ok(Message::Text(t))) => seen
                .texts
                .push(serde_json::from_str(&t).expect("JSON text")),
            Some(Ok(Message::Close(_))) | None => {
                seen.closed = true;
                return;
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("socket error: {e}; got {seen:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_process_is_started_attached_to_and_audited() {
    let t = TestServer::start();
    let id = open_sandbox(t.addr).await;
    let base = format!("/v1/sandboxes/{id}");
    let started = post_json(
        t.addr,
        &format!("{base}/processes"),
        &json!({
            "argv": ["sh", "-c", "echo ready; echo warn >&2; read line; echo got:$line; exit 4"],
            "stdin": true
        }),
    )
    .await
    .expect(201);
    let pid = started["id"].as_str().expect("process id").to_string();
    let execution_id = started["execution_id"]
        .as_str()
        .expect("execution id")
        .to_string();
    assert_eq!(started["kind"], "process", "{started}");
    assert!(started["exit"].is_null(), "{started}");

    let list = get(t.addr, &format!("{base}/processes")).await.expect(200);
    assert_eq!(list["processes"][0]["id"], pid.as_str(), "{list}");

    let mut socket = connect(t.addr, &format!("{base}/processes/{pid}/attach")).await;
    let mut seen = Seen::default();
    read_until(&mut socket, &mut seen, |s| {
        s.stdout().contains("ready") && !s.stderr.is_empty()
    })
    .await;
    assert_eq!(seen.stderr, b"warn\n");
    // A bad command is answered on the socket, which stays open.
    socket
        .send(Message::Text(r#"{"type":"explode"}"#.into()))
        .await
        .unwrap();
    read_until(&mut socket, &mut seen, |s| !s.texts.is_empty()).await;
    assert_eq!(seen.texts[0]["type"], "error", "{:?}", seen.texts);
    assert_eq!(seen.texts[0]["code"], "INVALID_OPTIONS", "{:?}", seen.texts);
    socket
        .send(Message::Binary(b"hello\n".to_vec().into()))
        .await
        .unwrap();
    read_until(&mut socket, &mut seen, |s| s.closed).await;
    assert_eq!(seen.stdout(), "ready\ngot:hello\n");
    let exit = seen
        .texts
        .iter()
        .find(|t| t["type"] == "exit")
        .expect("an exit message");
    assert_eq!(exit["exit_code"], 4, "{exit}");

    let info = get(t.addr, &format!("{base}/processes/{pid}"))
        .await
        .expect(200);
    assert_eq!(info["exit"]["exit_code"], 4, "{info}");

    // One audit entry, under the process's execution id, with its exit code.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let entry = loop {
        let audit = get(t.addr, "/v1/audit?limit=100").await.expect(200);
        let found = audit["entries"]
            .as_array()
            .or(audit.as_array())
            .into_iter()
            .flatten()
            .filter(|e| e["id"] == execution_id.as_str())
            .cloned()
            .collect::<Vec<_>>();
        if !found.is_empty() || tokio::time::Instant::now() > deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        entry.len(),
        1,
        "exactly one audit entry for the process: {entry:?}"
    );
    assert_eq!(entry[0]["exit_code"], 4, "{:?}", entry[0]);

    // Unknown processes and bad ids are plain errors.
    get(t.addr, &format!("{base}/processes/p99"))
        .await
        .expect_error(404, "NOT_FOUND");
    let r = Request::post(&format!("{base}/processes/{pid}/signal"))
        .json(&json!({"signal": "NOPE"}))
        .send(t.addr)
        .await;
    r.expect_error(400, "INVALID_OPTIONS");
    post_json(t.addr, &format!("{base}/processes"), &json!({"argv": []}))
        .await
        .expect_error(400, "INVALID_OPTIONS");
    // A client that keeps its socket open would hold the graceful stop up.
    drop(socket);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_ends_a_process_and_destroy_ends_the_rest() {
    let t = TestServer::start();
    let id = open_sandbox(t.addr).await;
    let base = format!("/v1/sandboxes/{id}");
    let trap = post_json(
        t.addr,
        &format!("{base}/processes"),
        &json!({"argv": ["sh", "-c", "trap 'exit 9' TERM; while :; do sleep 0.05; done"]}),
    )
    .await
    .expect(201);
    let sleeper = post_json(
        t.addr,
        &format!("{base}/processes"),
        &json!({"argv": ["sleep", "30"]}),
    )
    .await
    .expect(201);
    let (trap, sleeper) = (
        trap["id"].as_str().unwrap(),
        sleeper["id"].as_str().unwrap(),
    );
    // Give the shell a moment to install its trap.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = post_json(
        t.addr,
        &format!("{base}/processes/{trap}/signal"),
        &json!({"signal": "TERM"}),
    )
    .await
    .expect(200);
    assert_eq!(r["signal"], 15);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let info = get(t.addr, &format!("{base}/processes/{trap}"))
            .await
            .expect(200);
        if !info["exit"].is_null() {
            assert_eq!(info["exit"]["exit_code"], 9, "{info}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "TERM did not end it: {info}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = Request::delete(&base).send(t.addr).await;
    assert_eq!(r.status, 204, "{}", r.text());
    // The session is gone, and `sleep 30` with it.
    get(t.addr, &format!("{base}/processes/{sleeper}"))
        .await
        .expect_error(409, "ENGINE_DISPOSED");
    // No process runs from the destroyed sandbox's workdir any more.
    // The workdir is a directory named after the sandbox id.
    let mut survivors = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        if cwd.components().any(|c| c.as_os_str() == id.as_str()) {
            survivors.push(pid);
        }
    }
    assert!(
        survivors.is_empty(),
        "processes outlived their destroyed sandbox: {survivors:?}"
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_is_driven_over_a_websocket() {
    let t = TestServer::start();
    let id = open_sandbox(t.addr).await;
    let base = format!("/v1/sandboxes/{id}");
    let term = post_json(
        t.addr,
        &format!("{base}/terminals"),
        &json!({"command": "sh", "size": {"rows": 30, "cols": 90}}),
    )
    .await
    .expect(201);
    assert_eq!(term["kind"], "terminal", "{term}");
    let tid = term["id"].as_str().unwrap();
    let mut socket = connect(t.addr, &format!("{base}/processes/{tid}/attach")).await;
    let mut seen = Seen::default();
    socket
        .send(Message::Binary(b"stty size | tr ' ' x\n".to_vec().into()))
        .await
        .unwrap();
    read_until(&mut socket, &mut seen, |s| s.stdout().contains("30x90")).await;
    socket
        .send(Message::Text(
            r#"{"type":"resize","rows":41,"cols":101}"#.into(),
        ))
        .await
        .unwrap();
    socket
        .send(Message::Binary(b"stty size | tr ' ' y\n".to_vec().into()))
        .await
        .unwrap();
    read_until(&mut socket, &mut seen, |s| s.stdout().contains("41y101")).await;
    assert!(seen.stderr.is_empty(), "a terminal has one stream");
    socket
        .send(Message::Binary(b"exit 3\n".to_vec().into()))
        .await
        .unwrap();
    read_until(&mut socket, &mut seen, |s| s.closed).await;
    let exit = seen
        .texts
        .iter()
        .find(|t| t["type"] == "exit")
        .expect("an exit message");
    assert_eq!(exit["exit_code"], 3, "{exit}");
    drop(socket);
    t.stop().await;
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
c.sendall(b"conformance-reply:" + data.strip() + b"\n")
c.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_stream_reaches_a_service_in_the_guest() {
    let t = TestServer::start();
    let id = open_sandbox(t.addr).await;
    let base = format!("/v1/sandboxes/{id}");
    let listener = post_json(
        t.addr,
        &format!("{base}/processes"),
        &json!({"argv": ["python3", "-c", LISTENER]}),
    )
    .await
    .expect(201);
    let lid = listener["id"].as_str().unwrap();
    let mut attach = connect(t.addr, &format!("{base}/processes/{lid}/attach")).await;
    let mut seen = Seen::default();
    read_until(&mut attach, &mut seen, |s| s.stdout().contains('\n')).await;
    let port: u16 = seen
        .stdout()
        .trim()
        .strip_prefix("port=")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the listener printed {:?}", seen.stdout()));

    // Refusals come before any upgrade: not loopback, not a port, nothing there.
    get(t.addr, &format!("{base}/tcp/{port}?host=192.0.2.1"))
        .await
        .expect_error(400, "INVALID_OPTIONS");
    get(t.addr, &format!("{base}/tcp/http"))
        .await
        .expect_error(400, "INVALID_OPTIONS");

    let mut tcp = connect(t.addr, &format!("{base}/tcp/{port}")).await;
    tcp.send(Message::Binary(b"over-ws\n".to_vec().into()))
        .await
        .unwrap();
    let mut reply = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match tokio::time::timeout_at(deadline, tcp.next())
            .await
            .expect("a reply")
        {
            Some(Ok(Message::Binary(b))) => reply.extend_from_slice(&b),
            Some(Ok(Message::Close(_))) | None => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("socket error: {e}"),
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "conformance-reply:over-ws\n"
    );
    read_until(&mut attach, &mut seen, |s| s.closed).await;
    let exit = seen
        .texts
        .iter()
        .find(|t| t["type"] == "exit")
        .expect("an exit message");
    assert_eq!(exit["exit_code"], 0, "{exit}");
    // Nothing listens there any more.
    let r = Request::get(&format!("{base}/tcp/{port}"))
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send(t.addr)
        .await;
    r.expect_error(404, "NOT_FOUND");
    drop((tcp, attach));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_checks_background_commands_and_terminals() {
    let config = paddock::PaddockConfig::from_toml_str(
        r#"
[[policy.custom_rules]]
name = "no-netcat"
pattern = "\\bnc\\b"
target = "command"
action = "block"
message = "netcat is not allowed"
"#,
    )
    .expect("a valid config");
    let t = TestServer::start_config(config, crate::http::support::server_config());
    let id = open_sandbox(t.addr).await;
    let base = format!("/v1/sandboxes/{id}");
    let msg = post_json(
        t.addr,
        &format!("{base}/processes"),
        &json!({"argv": ["nc", "-l", "8000"]}),
    )
    .await
    .expect_error(400, "CODE_BLOCKED");
    assert!(msg.contains("netcat"), "{msg}");
    post_json(
        t.addr,
        &format!("{base}/terminals"),
        &json!({"command": "sh", "args": ["-c", "nc -l 8000"]}),
    )
    .await
    .expect_error(400, "CODE_BLOCKED");
    // Nothing was started.
    let list = get(t.addr, &format!("{base}/processes")).await.expect(200);
    assert_eq!(list["processes"], json!([]), "{list}");
    // An engine without the feature answers so.
    let js = post_json(t.addr, "/v1/sandboxes", &json!({"engine": "isolate"}))
        .await
        .expect(201);
    let js = js["id"].as_str().unwrap();
    post_json(
        t.addr,
        &format!("/v1/sandboxes/{js}/processes"),
        &json!({"argv": ["true"]}),
    )
    .await
    .expect_error(400, "CAPABILITY_NOT_SUPPORTED");
    t.stop().await;
}

/// How long after a close handshake the server may keep the TCP connection open. A
/// loopback close is a few round trips (well under a millisecond here); a lingering
/// connection took 750–890 ms. The server's own linger, for a client whose echo of
/// the close is late (one of a loaded machine's), is 100 ms: the bound leaves room
/// for it and a wake-up.
const CLOSE_WITHIN: Duration = Duration::from_millis(300);

/// Reads to the end of the connection after the close handshake; how long that took.
async fn until_closed(socket: &mut Socket) -> Duration {
    let from = tokio::time::Instant::now();
    loop {
        match tokio::time::timeout(PATIENCE, socket.next()).await {
            Ok(None) | Ok(Some(Err(_))) => return from.elapsed(),
            Ok(Some(Ok(_))) => {}
            Err(_) => panic!("the connection stayed open {PATIENCE:?} after the close"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_closes_end_the_connection_promptly() {
    let t = TestServer::start();
    let id = open_sandbox(t.addr).await;
    let base = format!("/v1/sandboxes/{id}");
    for round in 0..3 {
        // The server closes: the process exits, the close frame comes, the client
        // echoes it (tungstenite does on reading it), the connection ends.
        let started = post_json(
            t.addr,
            &format!("{base}/processes"),
            &json!({"argv": ["sh", "-c", "sleep 0.1; echo bye"]}),
        )
        .await
        .expect(201);
        let pid = started["id"].as_str().expect("process id").to_string();
        let mut socket = connect(t.addr, &format!("{base}/processes/{pid}/attach")).await;
        let mut seen = Seen::default();
        read_until(&mut socket, &mut seen, |s| s.closed).await;
        let took = until_closed(&mut socket).await;
        println!(
            "round {round}: server close: the connection ended {took:?} after the close frame"
        );
        assert!(
            took < CLOSE_WITHIN,
            "round {round}: the server's close took {took:?}"
        );

        // The client closes a terminal's socket: the server answers the close at once.
        let started = post_json(
            t.addr,
            &format!("{base}/terminals"),
            &json!({"command": "sh"}),
        )
        .await
        .expect(201);
        let pid = started["id"].as_str().expect("terminal id").to_string();
        let mut socket = connect(t.addr, &format!("{base}/processes/{pid}/attach")).await;
        socket.send(Message::Close(None)).await.unwrap();
        let from = tokio::time::Instant::now();
        loop {
            match tokio::time::timeout(PATIENCE, socket.next()).await {
                Ok(Some(Ok(Message::Close(_)))) => break,
                Ok(Some(Ok(_))) => {}
                other => panic!("round {round}: no close came back: {other:?}"),
            }
        }
        let took = from.elapsed();
        println!("round {round}: client close: answered in {took:?}");
        assert!(
            took < CLOSE_WITHIN,
            "round {round}: the close was answered in {took:?}"
        );
        // Then the server ends the connection (the client waits for it to, as RFC
        // 6455 has it), within its linger (100 ms) and a wake-up: not at the
        // client's own timeout.
        let took = until_closed(&mut socket).await;
        println!("round {round}: client close: the connection ended {took:?} after");
        assert!(
            took < Duration::from_secs(2),
            "round {round}: the connection ended {took:?} after the close"
        );
    }
    t.stop().await;
}
