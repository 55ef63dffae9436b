//! The `memory` scenario: how much the server holds for large outputs and for slow
//! readers of a large file, through a real `paddock serve` stack in this process.
//!
//! Two phases, each against the RSS of this process at rest before it:
//! - **outputs**: concurrent executions that each print `--output-mib` MiB (under the
//!   64 MiB default ceiling), answered over HTTP, then kept in the result store (64
//!   MiB per tenant by default). Reported: the peak RSS while they run, the RSS after,
//!   the bytes the result store keeps.
//! - **readers**: `--readers` clients download one `--file-mib` MiB (sparse) file of a
//!   sandbox at the same time, slowly (16 KiB every millisecond). Reported: the peak
//!   RSS, beside what buffering each download whole would take (`readers × file`).
//!
//! The client reads every response in small pieces and keeps none of it, so its own
//! memory does not count against the server's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::PaddockConfig;
use paddock_pool::Paddock;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{report, round, rss_bytes};

const MIB: u64 = 1 << 20;

/// Sends one request on a fresh connection and reads the answer in pieces of
/// `piece` bytes, pausing `pause` after each; returns the status, the body's length
/// and (when `keep` is set) the body.
async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    piece: usize,
    pause: Option<Duration>,
    keep: bool,
) -> std::io::Result<(u16, u64, Vec<u8>)> {
    request_counted(addr, method, path, body, piece, pause, keep, None).await
}

/// [`request`], adding the body bytes read to `counter` as they come.
#[allow(clippy::too_many_arguments)]
async fn request_counted(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    piece: usize,
    pause: Option<Duration>,
    keep: bool,
    counter: Option<&AtomicU64>,
) -> std::io::Result<(u16, u64, Vec<u8>)> {
    let mut conn = TcpStream::connect(addr).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body).await?;
    let mut buf = vec![0u8; piece];
    let mut head = Vec::new();
    let mut total = 0u64;
    let mut kept = Vec::new();
    let mut in_body = false;
    loop {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        if in_body {
            total += n as u64;
            if let Some(c) = counter {
                c.fetch_add(n as u64, Ordering::Relaxed);
            }
            if keep {
                kept.extend_from_slice(&buf[..n]);
            }
        } else {
            head.extend_from_slice(&buf[..n]);
            if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                let rest = &head[at + 4..];
                total += rest.len() as u64;
                if keep {
                    kept.extend_from_slice(rest);
                }
                head.truncate(at);
                in_body = true;
            }
        }
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
        }
    }
    let status = String::from_utf8_lossy(&head)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, total, kept))
}

async fn json_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &Value,
) -> std::io::Result<(u16, Value)> {
    let body = serde_json::to_vec(body).unwrap_or_default();
    let (status, _, data) = request(addr, method, path, &body, 64 << 10, None, true).await?;
    Ok((status, serde_json::from_slice(&data).unwrap_or(Value::Null)))
}

/// Samples this process's RSS every 10 ms until stopped; answers the peak.
struct Sampler {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<u64>,
}

impl Sampler {
    fn start() -> Sampler {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut peak = rss_bytes();
            loop {
                tokio::select! {
                    _ = &mut stopped => return peak.max(rss_bytes()),
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {
                        peak = peak.max(rss_bytes());
                    }
                }
            }
        });
        Sampler { stop, task }
    }

    async fn peak(self) -> u64 {
        let _ = self.stop.send(());
        self.task.await.unwrap_or(0)
    }
}

/// RSS at rest: after a pause, the lowest of a few readings.
async fn settled_rss() -> u64 {
    let mut low = u64::MAX;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        low = low.min(rss_bytes());
    }
    low
}

fn mib(bytes: u64) -> f64 {
    round(bytes as f64 / MIB as f64)
}

pub(super) async fn memory(
    outputs: usize,
    output_mib: u64,
    readers: usize,
    file_mib: u64,
    read_secs: u64,
    as_json: bool,
) -> Result<i32, crate::run::UsageError> {
    if output_mib == 0 || output_mib > 64 {
        return Err(crate::run::UsageError(
            "--output-mib must be 1 to 64 (the default ceiling of max_output_bytes)".into(),
        ));
    }
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = false;
    config.pool.max_size = (outputs + 2).max(4);
    config.server.listen = "127.0.0.1:0".into();
    let server_config = config.server.clone();
    let paddock = match Paddock::builder()
        .config(config)
        .without_isolate()
        .without_container()
        .start()
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    let server = match paddock_pool::http::start(paddock.clone(), server_config.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            let _ = paddock.shutdown(Duration::ZERO).await;
            return Ok(1);
        }
    };
    let addr = server.local_addr();
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        crate::run::UsageError(format!("paddock bench memory: {what}: {e}"))
    };

    // Warm the path once, then take the baseline.
    let _ = json_request(
        addr,
        "POST",
        "/v1/executions",
        &json!({"program": {"command": ["true"]}}),
    )
    .await;
    let baseline = settled_rss().await;

    // Outputs.
    let bytes = output_mib * MIB;
    let body = json!({
        "program": {"command": ["sh", "-c", format!("head -c {bytes} /dev/zero | tr '\\0' x")]},
        "limits": {"max_output_bytes": bytes},
    });
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let sampler = Sampler::start();
    let started = Instant::now();
    let runs: Vec<_> = (0..outputs)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move {
                request(addr, "POST", "/v1/executions", &body, 64 << 10, None, false).await
            })
        })
        .collect();
    let mut answered = 0u64;
    for r in runs {
        match r.await {
            Ok(Ok((200, n, _))) => answered += n,
            Ok(Ok((status, _, _))) => return Err(fail("an execution", &status)),
            Ok(Err(e)) => return Err(fail("an execution", &e)),
            Err(e) => return Err(fail("an execution", &e)),
        }
    }
    let outputs_secs = started.elapsed().as_secs_f64();
    let outputs_peak = sampler.peak().await;
    let outputs_after = settled_rss().await;
    let (_, stats) = json_request(addr, "GET", "/v1/stats", &Value::Null)
        .await
        .map_err(|e| fail("stats", &e))?;
    let kept = stats["results"]["bytes"].as_u64().unwrap_or(0);

    // Readers.
    let (status, sandbox) = json_request(addr, "POST", "/v1/sandboxes", &json!({}))
        .await
        .map_err(|e| fail("opening a sandbox", &e))?;
    let Some(id) = sandbox["id"]
        .as_str()
        .map(str::to_owned)
        .filter(|_| status == 201)
    else {
        return Err(fail("opening a sandbox", &sandbox));
    };
    let file_bytes = file_mib * MIB;
    let (status, made) = json_request(
        addr,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({"program": {"command": ["truncate", "-s", file_bytes.to_string(), "big.bin"]}}),
    )
    .await
    .map_err(|e| fail("making the file", &e))?;
    if status != 200 || made["exit_code"] != 0 {
        return Err(fail("making the file", &made));
    }
    let readers_baseline = settled_rss().await;
    let sampler = Sampler::start();
    let path = format!("/v1/sandboxes/{id}/files/big.bin");
    let deadline = Duration::from_secs(read_secs);
    let read_total = Arc::new(AtomicU64::new(0));
    let reads: Vec<_> = (0..readers)
        .map(|_| {
            let path = path.clone();
            let counter = read_total.clone();
            tokio::spawn(async move {
                let slow = request_counted(
                    addr,
                    "GET",
                    &path,
                    b"",
                    16 << 10,
                    Some(Duration::from_millis(1)),
                    false,
                    Some(&counter),
                );
                // A slow reader is cut off after `read_secs`; what it read counts.
                let _ = tokio::time::timeout(deadline, slow).await;
            })
        })
        .collect();
    for r in reads {
        let _ = r.await;
    }
    let read_total = read_total.load(Ordering::Relaxed);
    let readers_peak = sampler.peak().await;
    let _ = request(
        addr,
        "DELETE",
        &format!("/v1/sandboxes/{id}"),
        b"",
        4096,
        None,
        false,
    )
    .await;

    let buffered = readers as u64 * file_bytes;
    let reader_growth = readers_peak.saturating_sub(readers_baseline);
    let v = json!({
        "scenario": "memory",
        "baseline_rss_mib": mib(baseline),
        "outputs": {
            "executions": outputs,
            "output_mib_each": output_mib,
            "answered_mib": mib(answered),
            "secs": round(outputs_secs),
            "peak_rss_mib": mib(outputs_peak),
            "peak_growth_mib": mib(outputs_peak.saturating_sub(baseline)),
            "rss_after_mib": mib(outputs_after),
            "growth_after_mib": mib(outputs_after.saturating_sub(baseline)),
            "kept_result_mib": mib(kept),
            "kept_bound_mib": mib(server_config.max_result_bytes_per_tenant),
        },
        "readers": {
            "readers": readers,
            "file_mib": file_mib,
            "read_mib": mib(read_total),
            "secs": read_secs,
            "baseline_rss_mib": mib(readers_baseline),
            "peak_rss_mib": mib(readers_peak),
            "peak_growth_mib": mib(reader_growth),
            "buffered_whole_mib": mib(buffered),
            "growth_vs_buffered": round(reader_growth as f64 / buffered.max(1) as f64 * 1000.0) / 1000.0,
        },
        "pass": {
            "kept_within_bound": kept <= server_config.max_result_bytes_per_tenant,
            "readers_growth_under_64_mib": reader_growth < 64 * MIB,
        },
    });
    report(&v, as_json);
    server.stop().await;
    let _ = paddock.shutdown(Duration::from_secs(5)).await;
    let passed = v["pass"]
        .as_object()
        .is_some_and(|p| p.values().all(|b| b == true));
    Ok(if passed { 0 } else { 1 })
}
