//! OTLP/HTTP export to a collector stand-in on loopback (feature `otlp`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use paddock_telemetry::{execution_span, OtlpConfig, Telemetry, TraceParent, TracingConfig};

/// One request the stand-in received.
#[derive(Debug)]
struct Request {
    line: String,
    content_type: String,
    body: Vec<u8>,
}

/// Accepts OTLP/HTTP requests on 127.0.0.1 and answers each with an empty 200.
fn collector() -> (String, mpsc::Receiver<Request>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let tx = tx.clone();
            std::thread::spawn(move || serve(conn, tx));
        }
    });
    (url, rx)
}

fn serve(conn: TcpStream, tx: mpsc::Sender<Request>) {
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut writer = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let (mut len, mut content_type) = (0usize, String::new());
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap();
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => len = value.trim().parse().unwrap(),
                "content-type" => content_type = value.trim().to_owned(),
                _ => {}
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
            .unwrap();
        let _ = tx.send(Request {
            line: line.trim_end().to_owned(),
            content_type,
            body,
        });
    }
}

/// A proxy from the environment would carry the request off this machine.
fn proxy_configured() -> bool {
    ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
        .iter()
        .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn metrics_are_pushed_to_v1_metrics() {
    if proxy_configured() {
        eprintln!("skipped: an HTTP proxy is configured in the environment");
        return;
    }
    let (url, requests) = collector();
    let t = Telemetry::builder()
        .with_otlp(OtlpConfig::new(&url).with_interval(Duration::from_secs(3600)))
        .build()
        .unwrap();
    t.record_execution("subprocess", "completed");
    t.record_duration("subprocess", "completed", 3.0);
    t.force_flush().unwrap();

    let req = requests.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(req.line, "POST /v1/metrics HTTP/1.1");
    assert_eq!(req.content_type, "application/x-protobuf");
    for needle in [
        &b"paddock_executions"[..],
        b"paddock_execution_duration_ms",
        b"subprocess",
        b"completed",
    ] {
        assert!(
            contains(&req.body, needle),
            "{:?} missing",
            String::from_utf8_lossy(needle)
        );
    }
    t.shutdown().unwrap();
}

#[test]
fn execution_spans_are_pushed_to_v1_traces() {
    if proxy_configured() {
        eprintln!("skipped: an HTTP proxy is configured in the environment");
        return;
    }
    let (url, requests) = collector();
    let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (dispatch, guard) = TracingConfig::new("info")
        .with_env_filter(false)
        .with_test_writer()
        .with_otlp(&OtlpConfig::new(&url))
        .unwrap()
        .build()
        .unwrap();
    tracing::dispatcher::with_default(&dispatch, || {
        let span = execution_span("exec-otlp", "subprocess", "acme", Some(header));
        span.in_scope(|| tracing::info!("running"));
    });
    guard.shutdown().unwrap();

    let req = requests.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(req.line, "POST /v1/traces HTTP/1.1");
    assert_eq!(req.content_type, "application/x-protobuf");
    let tp = TraceParent::parse(header).unwrap();
    assert!(contains(&req.body, &tp.trace_id().to_bytes()));
    assert!(contains(&req.body, &tp.parent_id().to_bytes()));
    assert!(contains(&req.body, b"exec-otlp"));
}
