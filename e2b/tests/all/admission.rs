//! The control plane checks `X-API-Key` before it reads a byte of a body, and a body
//! that stalls is answered 408.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use paddock::PaddockConfig;
use paddock_core::{EngineName, IsolationLevel};
use paddock_e2b::{E2bConfig, TemplateConfig};
use paddock_pool::http::{ApiKey, HttpServerHandle, ServerConfig};
use paddock_pool::Paddock;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const KEY: &str = "key-e2b-admission-0123456789";

/// A Paddock serving the E2B API beside the native one on a loopback listener.
pub(crate) struct Server {
    paddock: Paddock,
    http: HttpServerHandle,
}

impl Server {
    /// One API key, bodies that may pause 300 ms.
    fn start() -> Server {
        Server::start_with(ServerConfig {
            api_keys: vec![ApiKey::new(KEY, "alpha")],
            body_read_timeout_ms: 300,
            ..ServerConfig::default()
        })
    }

    /// With `server`'s keys and settings, on a loopback port, level `none` allowed
    /// (template `quick` runs on the subprocess engine), one ready instance per pool.
    pub(crate) fn start_with(server: ServerConfig) -> Server {
        let server = ServerConfig {
            listen: "127.0.0.1:0".into(),
            allowed_levels: Some(vec![IsolationLevel::None]),
            ..server
        };
        let mut config = PaddockConfig::default();
        config.pool.min_idle = 1;
        let paddock = paddock::builder()
            .config(config)
            .access(server.access_rules())
            .start()
            .expect("Paddock starts");
        let quick = TemplateConfig {
            engine: Some(EngineName::SUBPROCESS),
            ..TemplateConfig::default()
        };
        let api = paddock_e2b::E2bApi::new(
            paddock.clone(),
            E2bConfig::default(),
            &server,
            [("quick".to_string(), quick)].into(),
        )
        .expect("the E2B API");
        let routes: paddock_pool::http::Extension = Arc::new(move |cfg| api.configure(cfg));
        let http = paddock_pool::http::start_with(paddock.clone(), server, vec![routes])
            .expect("the server starts");
        Server { paddock, http }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.http.local_addr()
    }

    pub(crate) async fn stop(self) {
        let _ = self.paddock.shutdown(Duration::from_secs(5)).await;
        self.http.stop().await;
    }
}

/// An answer: status, lower-case headers, JSON body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Value,
}

/// Sends `head` (with `Content-Length: announced`) and the first bytes of a body,
/// `sent`; returns the connection.
pub(crate) async fn send(
    addr: SocketAddr,
    head: &str,
    announced: usize,
    sent: &[u8],
) -> BufReader<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "{head}\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {announced}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(sent).await.unwrap();
    BufReader::new(stream)
}

/// Reads the answer (within 10 s).
pub(crate) async fn answer(conn: &mut BufReader<TcpStream>) -> Answer {
    let read = async {
        let mut status = 0;
        let mut headers = Vec::new();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            assert!(
                conn.read_line(&mut line).await.unwrap() > 0,
                "closed mid-head"
            );
            let line = line.trim_end();
            if status == 0 {
                status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
            } else if line.is_empty() {
                break;
            } else if let Some((k, v)) = line.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
                if k == "content-length" {
                    length = v.parse().unwrap();
                }
                headers.push((k, v));
            }
        }
        let mut body = vec![0u8; length];
        conn.read_exact(&mut body).await.unwrap();
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            body,
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("an answer within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_valid_key_is_answered_401_before_its_body_is_sent() {
    let s = Server::start();
    for path in [
        "/sandboxes",
        "/v2/sandboxes",
        "/sandboxes/sbx-1/timeout",
        "/sandboxes/sbx-1/connect",
        "/sandboxes/sbx-1/resume",
        "/v2/sandboxes/sbx-1/connect",
    ] {
        for key in ["", "X-API-Key: wrong-key-0123456789\r\n"] {
            let started = Instant::now();
            // A body is announced and never sent.
            let head = format!("POST {path} HTTP/1.1\r\n{key}")
                .trim_end()
                .to_string();
            let mut conn = send(s.addr(), &head, 1000, b"").await;
            let a = answer(&mut conn).await;
            assert_eq!(a.status, 401, "{path} {key:?}: {}", a.body);
            assert_eq!(a.body["code"], 401, "{}", a.body);
            assert!(
                a.body["message"].as_str().unwrap().contains("X-API-Key"),
                "{}",
                a.body
            );
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(3),
                "{path}: answered after {took:?}"
            );
            // And the connection is not kept waiting for the body either.
            let mut rest = Vec::new();
            tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest))
                .await
                .unwrap_or_else(|_| panic!("{path}: the connection was held after the 401"))
                .ok();
        }
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_body_that_stalls_is_answered_408() {
    let s = Server::start();
    let started = Instant::now();
    let head = format!("POST /sandboxes HTTP/1.1\r\nX-API-Key: {KEY}");
    let mut conn = send(s.addr(), &head, 100, b"{\"templ").await;
    let a = answer(&mut conn).await;
    assert_eq!(a.status, 408, "{}", a.body);
    assert_eq!(a.body["code"], 408, "{}", a.body);
    let message = a.body["message"].as_str().unwrap();
    assert!(message.contains("server.body_read_timeout_ms"), "{message}");
    assert!(
        a.headers
            .iter()
            .any(|(k, v)| k == "connection" && v == "close"),
        "{:?}",
        a.headers
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // No sandbox was opened for it.
    let mut conn = send(
        s.addr(),
        &format!("GET /sandboxes HTTP/1.1\r\nX-API-Key: {KEY}"),
        0,
        b"",
    )
    .await;
    let a = answer(&mut conn).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body, serde_json::json!([]));
    s.stop().await;
}

/// A Connect envelope (`flags`, then the JSON message's length and bytes).
fn envelope(flags: u8, message: &Value) -> bytes::Bytes {
    let payload = message.to_string().into_bytes();
    let mut out = vec![flags];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    out.into()
}

/// A request to the sandbox agent of `id`, its head only; `body` is its body.
fn agent_request<B>(
    addr: SocketAddr,
    id: &str,
    token: &str,
    rpc: &str,
    body: B,
) -> hyper::Request<B> {
    hyper::Request::builder()
        .method("POST")
        .uri(format!("/process.Process/{rpc}"))
        .header("host", addr.to_string())
        .header("e2b-sandbox-id", id)
        .header("e2b-sandbox-port", "49983")
        .header("x-access-token", token)
        .header("content-type", "application/connect+json")
        .body(body)
        .expect("a request")
}

/// Sends `request` on a connection of its own.
async fn call<B>(
    addr: SocketAddr,
    request: hyper::Request<B>,
) -> hyper::Response<hyper::body::Incoming>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    sender.send_request(request).await.expect("an answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_client_stream_outlives_the_body_timeout() {
    let s = Server::start();
    let addr = s.addr();
    let mut conn = send(
        addr,
        &format!("POST /sandboxes HTTP/1.1\r\nX-API-Key: {KEY}"),
        22,
        br#"{"templateID":"quick"}"#,
    )
    .await;
    let created = answer(&mut conn).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let id = created.body["sandboxID"].as_str().unwrap().to_string();
    let token = created.body["envdAccessToken"]
        .as_str()
        .unwrap()
        .to_string();

    // `cat`, with its stdin open; its output streams back on the Start call.
    let start = json!({"process": {"cmd": "cat", "args": []}, "stdin": true});
    let started = call(
        addr,
        agent_request(
            addr,
            &id,
            &token,
            "Start",
            http_body_util::Full::new(envelope(0, &start)),
        ),
    )
    .await;
    assert_eq!(started.status(), 200);
    let mut output = started.into_body();
    let mut seen = Vec::new();
    let mut next_message = async || -> Value {
        loop {
            if seen.len() >= 5 {
                let n = u32::from_be_bytes([seen[1], seen[2], seen[3], seen[4]]) as usize;
                if seen.len() >= 5 + n {
                    let message: Value = serde_json::from_slice(&seen[5..5 + n]).unwrap();
                    seen.drain(..5 + n);
                    return message;
                }
            }
            let frame = tokio::time::timeout(Duration::from_secs(20), output.frame())
                .await
                .expect("output within 20 s")
                .expect("the Start stream is open")
                .expect("a frame");
            if let Ok(data) = frame.into_data() {
                seen.extend_from_slice(&data);
            }
        }
    };
    let first = next_message().await;
    let pid = first["event"]["start"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("{first}"));

    // StreamInput: the process named, then silence for five times the body timeout,
    // then input.
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
    let body = http_body_util::StreamBody::new(
        tokio_stream_of(rx).map(|b| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b))),
    );
    let input = tokio::spawn(call(
        addr,
        agent_request(addr, &id, &token, "StreamInput", body),
    ));
    tx.send(envelope(0, &json!({"start": {"process": {"pid": pid}}})))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stdin = base64::engine::general_purpose::STANDARD.encode("still here\n");
    tx.send(envelope(0, &json!({"data": {"input": {"stdin": stdin}}})))
        .await
        .unwrap();
    let mut echoed = String::new();
    while !echoed.contains("still here") {
        let m = next_message().await;
        if let Some(out) = m["event"]["data"]["stdout"].as_str() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(out)
                .unwrap();
            echoed.push_str(&String::from_utf8_lossy(&bytes));
        }
        assert!(m["event"].get("end").is_none(), "cat ended first: {m}");
    }
    // The stream ends as the client ends it, and is answered then.
    tx.send(envelope(0x02, &json!({}))).await.unwrap();
    drop(tx);
    let answered = tokio::time::timeout(Duration::from_secs(20), input)
        .await
        .expect("StreamInput answered within 20 s")
        .unwrap();
    assert_eq!(answered.status(), 200);
    let end = answered.into_body().collect().await.unwrap().to_bytes();
    assert!(!String::from_utf8_lossy(&end).contains("error"), "{end:?}");
    s.stop().await;
}

/// The chunks `rx` receives, as a stream.
fn tokio_stream_of(
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
) -> impl futures_util::Stream<Item = bytes::Bytes> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
}
