//! `process.Process/SendInput` to a process that does not read its stdin: many
//! concurrent large calls are all answered, within the process's input buffer and
//! the tenant's budget (`limiter.max_input_bytes_per_*`), the rest refused with
//! `resource_exhausted`; the process stays usable.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use http_body_util::BodyExt;
use paddock::PaddockConfig;
use paddock_core::{EngineName, IsolationLevel};
use paddock_e2b::{E2bConfig, TemplateConfig};
use paddock_pool::http::{ApiKey, ServerConfig};
use serde_json::{json, Value};
use tokio::net::TcpStream;

const KEY: &str = "key-e2b-input-0123456789abcdef";
const KIB: usize = 1 << 10;
/// Bytes of each SendInput call's chunk.
const CHUNK: usize = 192 * KIB;

/// One request on a connection of its own: the status and the body.
async fn call(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, bytes::Bytes) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method("POST")
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .expect("a request");
    let answer = tokio::time::timeout(Duration::from_secs(30), async {
        let r = sender.send_request(request).await.expect("an answer");
        let status = r.status().as_u16();
        (status, r.into_body().collect().await.unwrap().to_bytes())
    })
    .await
    .expect("answered within 30 s");
    answer
}

/// The Connect messages (JSON) in a stream's body.
fn messages(mut body: &[u8]) -> Vec<Value> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let n = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        out.push(serde_json::from_slice(&body[5..5 + n]).unwrap_or(Value::Null));
        body = &body[5 + n..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_send_input_to_a_process_that_does_not_read_is_bounded() {
    let server = ServerConfig {
        listen: "127.0.0.1:0".into(),
        api_keys: vec![ApiKey::new(KEY, "alpha")],
        allowed_levels: Some(vec![IsolationLevel::None]),
        ..ServerConfig::default()
    };
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 1;
    config.limiter.max_input_bytes_per_process = 256 * KIB as u64;
    config.limiter.max_input_bytes_per_tenant = 512 * KIB as u64;
    config.limiter.input_wait_ms = 200;
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
    let addr = http.local_addr();

    let (status, created) = call(
        addr,
        "/sandboxes",
        &[("x-api-key", KEY), ("content-type", "application/json")],
        br#"{"templateID":"quick"}"#.to_vec(),
    )
    .await;
    assert_eq!(status, 201, "{created:?}");
    let created: Value = serde_json::from_slice(&created).unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let agent = |content_type: &'static str| {
        vec![
            ("e2b-sandbox-id", id.clone()),
            ("e2b-sandbox-port", "49983".to_string()),
            ("x-access-token", token.clone()),
            ("content-type", content_type.to_string()),
        ]
    };
    let unary = |rpc: &'static str, message: Value| {
        let headers = agent("application/json");
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (status, body) = call(
                addr,
                &format!("/process.Process/{rpc}"),
                &headers,
                message.to_string().into_bytes(),
            )
            .await;
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            (status, body)
        }
    };

    // A process that reads nothing for 5 s, then counts its input. Its events
    // stream back on the Start call, read in the background.
    let start = json!({
        "process": {"cmd": "sh", "args": ["-c", "sleep 5; exec wc -c"]},
        "stdin": true,
    });
    let mut envelope = vec![0u8];
    let payload = start.to_string().into_bytes();
    envelope.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    envelope.extend_from_slice(&payload);
    let events = {
        let headers = agent("application/connect+json");
        tokio::spawn(async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            call(addr, "/process.Process/Start", &headers, envelope).await
        })
    };
    let pid = 'found: {
        for _ in 0..200 {
            let (_, list) = unary("List", json!({})).await;
            if let Some(pid) = list["processes"][0]["pid"].as_u64() {
                break 'found pid;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the process never started");
    };

    // 24 concurrent calls of 192 KiB each (256 KiB of base64).
    let input = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; CHUNK]);
    let message = json!({"process": {"pid": pid}, "input": {"stdin": input}});
    let calls: Vec<_> = (0..24)
        .map(|_| tokio::spawn(unary("SendInput", message.clone())))
        .collect();
    let (mut accepted, mut refused) = (0usize, 0usize);
    for c in calls {
        let (status, body) = c.await.unwrap();
        if status == 200 {
            accepted += 1;
        } else {
            refused += 1;
            assert_eq!(body["code"], "resource_exhausted", "{status} {body}");
            let why = body["message"].as_str().unwrap_or_default();
            assert!(
                why.contains("has not read") || why.contains("max_input_bytes_per_tenant"),
                "{why}"
            );
        }
    }
    assert!(accepted >= 1, "nothing was accepted");
    assert!(
        refused >= 1,
        "all 24 calls were accepted: the buffer is unbounded"
    );
    assert!(
        accepted * CHUNK <= 512 * KIB + 64 * KIB,
        "{accepted} chunks of {CHUNK} bytes were accepted"
    );

    // Still usable: once it reads, it takes more; then it ends at the close and
    // counts exactly what was accepted.
    let mut more = 0;
    for _ in 0..300 {
        let (status, body) = unary("SendInput", message.clone()).await;
        if status == 200 {
            more = CHUNK;
            break;
        }
        assert_eq!(body["code"], "resource_exhausted", "{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(more, CHUNK, "the process never took more input");
    let (status, body) = unary("CloseStdin", json!({"process": {"pid": pid}})).await;
    assert_eq!(status, 200, "{body}");
    let (status, stream) = events.await.unwrap();
    assert_eq!(status, 200);
    let mut stdout = Vec::new();
    for m in messages(&stream) {
        if let Some(out) = m["event"]["data"]["stdout"].as_str() {
            stdout.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(out)
                    .unwrap(),
            );
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&stdout).trim(),
        (accepted * CHUNK + more).to_string()
    );
    let _ = paddock.shutdown(Duration::from_secs(5)).await;
    http.stop().await;
}
