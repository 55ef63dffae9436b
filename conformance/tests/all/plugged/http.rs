//! `ns-shell` behind the HTTP API: a `Paddock` with it as its only engine serves an
//! execution, and refuses engines nobody registered or names that are no names.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use paddock_pool::http::ServerConfig;
use paddock_pool::Paddock;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::engine_or_skip;

/// No exchange with the server may take longer.
const EXCHANGE_WITHIN: Duration = Duration::from_secs(30);

/// Prints, one per line: the program's pid namespace and network namespace, its pid,
/// how many processes its `/proc` lists, and the network interfaces it has.
const PROBE: &str = "readlink /proc/self/ns/pid; readlink /proc/self/ns/net; echo $$; \
                     ls /proc | grep -c '^[0-9]'; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '";

#[test]
fn http_runs_an_execution_on_ns_shell() {
    let Some(engine) = engine_or_skip("http_runs_an_execution_on_ns_shell") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        let server = ServerConfig {
            listen: "127.0.0.1:0".into(),
            ..ServerConfig::default()
        };
        // The plug-in is the only engine: no built-in one could answer for it (the
        // scheduler's own builder makes none).
        let paddock = Paddock::builder()
            .engine(Arc::new(engine))
            .access(server.access_rules())
            .start()
            .expect("Paddock starts with the ns-shell engine");
        assert_eq!(paddock.engines(), ["ns-shell"]);
        let handle = paddock_pool::http::start(paddock.clone(), server).expect("the server starts");
        let addr = handle.local_addr();
        assert!(addr.ip().is_loopback(), "{addr}");

        let (status, r) = post(
            addr,
            &json!({"engine": "ns-shell", "program": {"command": ["sh", "-c", PROBE]}}),
        )
        .await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["outcome"], "completed", "{r}");
        assert_eq!(r["exit_code"], 0, "{r}");
        assert_eq!(r["engine"], "ns-shell", "{r}");
        assert!(
            r["instance_id"].as_str().is_some_and(|id| !id.is_empty()),
            "{r}"
        );
        let stdout = r["stdout"].as_str().expect("stdout is text");
        let lines: Vec<&str> = stdout.lines().collect();
        let [pid_ns, net_ns, pid, processes, interfaces @ ..] = lines.as_slice() else {
            panic!("the probe printed too little: {r}");
        };
        let ours = |ns: &str| {
            std::fs::read_link(format!("/proc/self/ns/{ns}"))
                .expect("our own namespace")
                .to_string_lossy()
                .into_owned()
        };
        assert!(pid_ns.starts_with("pid:["), "{r}");
        assert_ne!(
            *pid_ns,
            ours("pid"),
            "the program ran in our pid namespace: {r}"
        );
        assert!(net_ns.starts_with("net:["), "{r}");
        assert_ne!(
            *net_ns,
            ours("net"),
            "the program ran in our network namespace: {r}"
        );
        assert_eq!(interfaces, ["lo"], "network `none` has loopback only: {r}");
        // Its /proc is its own pid namespace's, numbered afresh: only the
        // namespace's init started before it, so the program is pid 2, and both
        // still run when it counts.
        let pid: usize = pid.parse().expect("a pid");
        let processes: usize = processes.parse().expect("a count");
        assert_eq!(
            pid, 2,
            "the program is the namespace's first process after its init: {r}"
        );
        assert!(processes >= 2, "its /proc lists its init and itself: {r}");

        let (status, r) = post(
            addr,
            &json!({"engine": "no-such", "program": {"command": ["true"]}}),
        )
        .await;
        assert_eq!(status, 400, "{r}");
        assert_eq!(r["error"]["code"], "CAPABILITY_NOT_SUPPORTED", "{r}");
        let message = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("no-such") && message.contains("ns-shell"),
            "the refusal names the engine asked for and those configured: {r}"
        );

        let (status, r) = post(
            addr,
            &json!({"engine": "Bad Name", "program": {"command": ["true"]}}),
        )
        .await;
        assert_eq!(status, 400, "{r}");
        assert_eq!(r["error"]["code"], "INVALID_OPTIONS", "{r}");
        let message = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("engine") && message.contains("not an engine name"),
            "the refusal names the field and the rule: {r}"
        );

        handle.begin_drain();
        paddock
            .shutdown(Duration::from_secs(5))
            .await
            .expect("Paddock shuts down");
        handle.stop().await;
    });
}

/// `POST /v1/executions` with `body` over one HTTP/1.1 connection; the status and the
/// JSON answer.
async fn post(addr: SocketAddr, body: &Value) -> (u16, Value) {
    let exchange = async {
        let body = serde_json::to_vec(body).expect("JSON");
        let mut stream = TcpStream::connect(addr).await.expect("connecting");
        let head = format!(
            "POST /v1/executions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.expect("writing");
        stream.write_all(&body).await.expect("writing");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("reading");
        answer
    };
    let answer = tokio::time::timeout(EXCHANGE_WITHIN, exchange)
        .await
        .expect("the server answered in time");
    let text = String::from_utf8(answer).expect("a UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    let value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    (status, value)
}

/// The payload of a chunked body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].strip_prefix("\r\n").unwrap_or_default();
    }
    out
}
