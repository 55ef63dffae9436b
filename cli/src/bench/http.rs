//! The `http` scenario: executions per second over HTTP at 64 concurrent clients,
//! beside the in-process `Paddock` handle's rate from the same run, both on the no-op
//! engine so the figure is the API's own cost.
//!
//! The client is a minimal HTTP/1.1 keep-alive client (one connection per caller) on
//! loopback.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{EngineName, ExecRequest, Program};
use paddock_pool::Execute;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::report;

const BODY: &str = r#"{"engine":"noop","program":{"command":["noop"]}}"#;

/// Sends one POST on a keep-alive connection and returns the status.
async fn post(conn: &mut BufReader<TcpStream>, host: &str) -> std::io::Result<u16> {
    let req = format!(
        "POST /v1/executions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    conn.get_mut().write_all(req.as_bytes()).await?;
    let mut line = String::new();
    conn.read_line(&mut line).await?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line `{line}`")))?;
    let mut length = 0usize;
    loop {
        line.clear();
        conn.read_line(&mut line).await?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l
            .split_once(':')
            .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        {
            length = v.1.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).await?;
    Ok(status)
}

pub(super) async fn http(
    callers: usize,
    total: usize,
    as_json: bool,
) -> Result<i32, crate::run::UsageError> {
    let mut config = PaddockConfig::default();
    config.server.listen = "127.0.0.1:0".into();
    let server_config = config.server.clone();
    let paddock = match super::pipeline::noop_paddock(callers, config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    let server = match paddock_pool::http::start(paddock.clone(), server_config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    let addr = server.local_addr();

    // In-process rate: the handle from this runtime, `callers` concurrent loops.
    let run_inproc = |n: usize| {
        let paddock = paddock.clone();
        async move {
            let next = Arc::new(AtomicUsize::new(0));
            let start = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..callers {
                let (paddock, next) = (paddock.clone(), next.clone());
                tasks.push(tokio::spawn(async move {
                    while next.fetch_add(1, Ordering::Relaxed) < n {
                        let msg = Execute::new(ExecRequest::new(Program::command(["noop"])))
                            .on(EngineName::NOOP);
                        let r = paddock.execute_with(msg).await;
                        assert!(matches!(r, Ok(ref r) if r.is_success()), "{r:?}");
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            start.elapsed()
        }
    };
    let run_http = |n: usize| async move {
        let next = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..callers {
            let (next, failures) = (next.clone(), failures.clone());
            tasks.push(tokio::spawn(async move {
                let Ok(stream) = TcpStream::connect(addr).await else {
                    failures.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let _ = stream.set_nodelay(true);
                let mut conn = BufReader::new(stream);
                let host = addr.to_string();
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    match post(&mut conn, &host).await {
                        Ok(200) => {}
                        _ => {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        (start.elapsed(), failures.load(Ordering::Relaxed))
    };
    // Warm up both, then measure.
    run_inproc(total / 10).await;
    run_http(total / 10).await;
    let inproc = run_inproc(total).await;
    let (http_elapsed, failures) = run_http(total).await;
    let stats = paddock.stats().await.ok();
    server.stop().await;
    let _ = paddock.shutdown(Duration::from_secs(5)).await;
    report(
        &json!({
            "scenario": "http",
            "engine": "noop",
            "callers": callers,
            "executions": total,
            "http_per_s": (total as f64 / http_elapsed.as_secs_f64()).round(),
            "inproc_per_s": (total as f64 / inproc.as_secs_f64()).round(),
            "http_failures": failures,
            "accepted": stats.map(|s| s.accepted_total.unwrap_or_default()),
        }),
        as_json,
    );
    Ok(if failures == 0 { 0 } else { 1 })
}
