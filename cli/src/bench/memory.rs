//! The `memory` scenario: how much the server holds under one tenant's worst case,
//! through a real `paddock serve` stack (native API and E2B API, one API key) in
//! this process.
//!
//! Three phases, each against the RSS of this process at rest before it:
//! - **stdin**: `--inputs` concurrent E2B `SendInput` calls of `--input-kib` KiB each
//!   (1 MiB by default: the largest message the agent takes) to one process that never
//!   reads its stdin. Reported: how many were accepted and refused, the peak RSS
//!   while they are answered and the RSS once they all were (the process still
//!   alive), beside what holding every chunk would take.
//! - **outputs**: `--outputs` concurrent executions that each print `--output-mib`
//!   MiB (64 by default: the default ceiling of `max_output_bytes`), answered over
//!   HTTP, then kept in the result store. Reported: the peak RSS while they run, how
//!   many were cut by the tenant's output budget, the RSS after, the bytes kept.
//! - **readers**: `--readers` clients download one `--file-mib` MiB (sparse) file of a
//!   sandbox at the same time, slowly (16 KiB every millisecond). Reported: the peak
//!   RSS, beside what buffering each download whole would take (`readers × file`).
//!
//! The first two run `--runs` times; each run's figures are listed and their
//! medians reported. Peaks are the larger of the RSS sampled every 10 ms and the
//! kernel's high-water mark (`VmHWM`, reset before each run through
//! `/proc/self/clear_refs`). The client sends one shared copy of the input and reads
//! every response in small pieces keeping none of it, so its own memory hardly
//! counts against the server's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{EngineName, IsolationLevel};
use paddock_e2b::TemplateConfig;
use paddock_pool::http::ApiKey;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{report, round, round3, rss_bytes, status_field};

const MIB: u64 = 1 << 20;
/// The API key of the scenario's one tenant.
const KEY: &str = "bench-memory-key-0123456789abcdef";
/// The E2B agent's port.
const AGENT_PORT: &str = "49983";

/// The settings of one run of the scenario.
#[derive(Debug, Clone, Copy)]
pub(super) struct MemoryArgs {
    /// Concurrent `SendInput` calls.
    pub(super) inputs: usize,
    /// KiB of each call's message.
    pub(super) input_kib: u64,
    /// Concurrent executions at the output ceiling.
    pub(super) outputs: usize,
    /// MiB each execution prints.
    pub(super) output_mib: u64,
    /// Concurrent slow readers of one file.
    pub(super) readers: usize,
    /// The file's size in MiB.
    pub(super) file_mib: u64,
    /// How long each reader reads.
    pub(super) read_secs: u64,
    /// Runs of the stdin and outputs phases.
    pub(super) runs: usize,
    /// The memory budgets raised to their maxima.
    pub(super) unbounded: bool,
}

/// What one request was answered.
struct Answered {
    status: u16,
    /// Bytes of the body.
    total: u64,
    /// The body, when asked to keep it.
    kept: Vec<u8>,
    /// The body's last bytes (up to 4 KiB).
    tail: Vec<u8>,
}

/// Sends one request on a fresh connection (with `headers`, lines ending in CRLF)
/// and reads the answer in pieces of `piece` bytes, pausing `pause` after each;
/// adds the body's bytes to `counter` as they come and keeps the body when `keep`.
#[allow(clippy::too_many_arguments)]
async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
    piece: usize,
    pause: Option<Duration>,
    keep: bool,
    counter: Option<&AtomicU64>,
) -> std::io::Result<Answered> {
    let mut conn = TcpStream::connect(addr).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    // A server that refuses a body before reading all of it answers, then closes:
    // its answer is still read.
    let _ = conn.write_all(body).await;
    let mut buf = vec![0u8; piece];
    let mut head = Vec::new();
    let mut a = Answered {
        status: 0,
        total: 0,
        kept: Vec::new(),
        tail: Vec::new(),
    };
    let mut in_body = false;
    let take = |a: &mut Answered, bytes: &[u8]| {
        a.total += bytes.len() as u64;
        if let Some(c) = counter {
            c.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        if keep {
            a.kept.extend_from_slice(bytes);
        }
        a.tail.extend_from_slice(bytes);
        if a.tail.len() > 8192 {
            a.tail.drain(..a.tail.len() - 4096);
        }
    };
    loop {
        let n = match conn.read(&mut buf).await {
            Ok(n) => n,
            // A reset after the answer's head (a refused body) ends it.
            Err(_) if in_body || !head.is_empty() => 0,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        if in_body {
            take(&mut a, &buf[..n]);
        } else {
            head.extend_from_slice(&buf[..n]);
            if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                let rest = head[at + 4..].to_vec();
                take(&mut a, &rest);
                head.truncate(at);
                in_body = true;
            }
        }
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
        }
    }
    a.status = String::from_utf8_lossy(&head)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok(a)
}

/// The native API's credential.
fn bearer() -> String {
    format!("Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n")
}

async fn json_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &Value,
) -> std::io::Result<(u16, Value)> {
    let body = match body {
        Value::Null => Vec::new(),
        b => serde_json::to_vec(b).unwrap_or_default(),
    };
    let a = request(
        addr,
        method,
        path,
        headers,
        &body,
        64 << 10,
        None,
        true,
        None,
    )
    .await?;
    Ok((
        a.status,
        serde_json::from_slice(&a.kept).unwrap_or(Value::Null),
    ))
}

/// Samples this process's RSS every 10 ms until stopped; answers the peak, with the
/// kernel's high-water mark since the sampler started.
struct Sampler {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<u64>,
}

impl Sampler {
    fn start() -> Sampler {
        // Resets VmHWM to the current RSS (Linux 4.0 and later).
        let _ = std::fs::write("/proc/self/clear_refs", "5");
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
        let sampled = self.task.await.unwrap_or(0);
        sampled.max(status_field("VmHWM:") * 1024)
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

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => round((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Baseline, peak and their ratio of one run, in MiB.
fn rss_figures(baseline: u64, peak: u64) -> Value {
    json!({
        "baseline_rss_mib": mib(baseline),
        "peak_rss_mib": mib(peak),
        "peak_growth_mib": mib(peak.saturating_sub(baseline)),
        "peak_to_baseline": round3(peak as f64 / baseline.max(1) as f64),
    })
}

/// The medians of each figure over runs.
fn medians(runs: &[Value], fields: &[&str]) -> Value {
    let mut out = serde_json::Map::new();
    for f in fields {
        let values: Vec<f64> = runs.iter().filter_map(|r| r[*f].as_f64()).collect();
        out.insert((*f).to_string(), json!(median(&values)));
    }
    Value::Object(out)
}

type Failure = crate::run::UsageError;

fn fail(what: &str, e: &dyn std::fmt::Display) -> Failure {
    crate::run::UsageError(format!("paddock bench memory: {what}: {e}"))
}

/// An E2B sandbox with a process that never reads its stdin: the sandbox's id,
/// access token and the process's pid.
async fn stuck_process(addr: std::net::SocketAddr) -> Result<(String, String, u64), Failure> {
    let (status, created) = json_request(
        addr,
        "POST",
        "/sandboxes",
        &format!("X-API-Key: {KEY}\r\nContent-Type: application/json\r\n"),
        &json!({"templateID": "base"}),
    )
    .await
    .map_err(|e| fail("creating an E2B sandbox", &e))?;
    let (Some(id), Some(token)) = (
        created["sandboxID"].as_str().filter(|_| status == 201),
        created["envdAccessToken"].as_str(),
    ) else {
        return Err(fail("creating an E2B sandbox", &created));
    };
    let start = json!({"process": {"cmd": "sleep", "args": ["600"]}, "stdin": true})
        .to_string()
        .into_bytes();
    let mut envelope = vec![0u8];
    envelope.extend_from_slice(&(start.len() as u32).to_be_bytes());
    envelope.extend_from_slice(&start);
    // The Start call streams the process's events; its first names the pid. The
    // process goes on when the call is dropped.
    let mut conn = TcpStream::connect(addr)
        .await
        .map_err(|e| fail("starting the process", &e))?;
    let head = format!(
        "POST /process.Process/Start HTTP/1.1\r\nHost: {addr}\r\n{}Content-Type: application/connect+json\r\nContent-Length: {}\r\n\r\n",
        agent_headers(id, token),
        envelope.len()
    );
    conn.write_all(head.as_bytes())
        .await
        .map_err(|e| fail("starting the process", &e))?;
    conn.write_all(&envelope)
        .await
        .map_err(|e| fail("starting the process", &e))?;
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 4096];
    let pid = loop {
        let text = String::from_utf8_lossy(&seen);
        if let Some(at) = text.find("\"pid\":") {
            let digits: String = text[at + 6..]
                .chars()
                .skip_while(|c| c.is_whitespace())
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(pid) = digits.parse::<u64>() {
                break pid;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf))
            .await
            .map_err(|e| fail("starting the process", &e))?
            .map_err(|e| fail("starting the process", &e))?;
        if n == 0 {
            return Err(fail("starting the process", &text));
        }
        seen.extend_from_slice(&buf[..n]);
    };
    Ok((id.to_string(), token.to_string(), pid))
}

fn agent_headers(id: &str, token: &str) -> String {
    format!("E2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: {AGENT_PORT}\r\nX-Access-Token: {token}\r\n")
}

/// One run of the stdin phase.
async fn stdin_run(
    addr: std::net::SocketAddr,
    inputs: usize,
    input_kib: u64,
) -> Result<Value, Failure> {
    let (id, token, pid) = stuck_process(addr).await?;
    let headers = format!(
        "{}Content-Type: application/json\r\n",
        agent_headers(&id, &token)
    );
    // A chunk of `x` whose message takes nearly `input_kib` (base64, `eHh4` for every
    // three bytes, is 4/3 of it).
    let thirds = (input_kib as usize * 1024 - 128) / 4;
    let chunk = 3 * thirds;
    let input = "eHh4".repeat(thirds);
    let body: Arc<Vec<u8>> = Arc::new(
        json!({"process": {"pid": pid}, "input": {"stdin": input}})
            .to_string()
            .into_bytes(),
    );
    drop(input);
    let message_bytes = body.len() as u64;
    let baseline = settled_rss().await;
    let sampler = Sampler::start();
    let started = Instant::now();
    let calls: Vec<_> = (0..inputs)
        .map(|_| {
            let (body, headers) = (body.clone(), headers.clone());
            tokio::spawn(async move {
                request(
                    addr,
                    "POST",
                    "/process.Process/SendInput",
                    &headers,
                    &body,
                    4096,
                    None,
                    false,
                    None,
                )
                .await
            })
        })
        .collect();
    let (mut accepted, mut refused, mut other) = (0u64, 0u64, 0u64);
    for c in calls {
        match c.await {
            Ok(Ok(a)) if a.status == 200 => accepted += 1,
            Ok(Ok(a)) if a.status == 429 => refused += 1,
            _ => other += 1,
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let peak = sampler.peak().await;
    drop(body);
    // What the server still holds once every call was answered, the process alive.
    let held = settled_rss().await;
    // The process is killed with its sandbox.
    let _ = request(
        addr,
        "DELETE",
        &format!("/sandboxes/{id}"),
        &format!("X-API-Key: {KEY}\r\n"),
        b"",
        4096,
        None,
        false,
        None,
    )
    .await;
    let mut v = rss_figures(baseline, peak);
    let o = v.as_object_mut().expect("an object");
    o.insert("accepted".into(), json!(accepted));
    o.insert("refused".into(), json!(refused));
    o.insert("other".into(), json!(other));
    o.insert("secs".into(), json!(round(secs)));
    o.insert("rss_answered_mib".into(), json!(mib(held)));
    o.insert(
        "growth_answered_mib".into(),
        json!(mib(held.saturating_sub(baseline))),
    );
    o.insert(
        "held_whole_mib".into(),
        json!(mib(inputs as u64 * chunk as u64)),
    );
    o.insert("message_bytes".into(), json!(message_bytes));
    Ok(v)
}

/// One run of the outputs phase.
async fn outputs_run(
    addr: std::net::SocketAddr,
    outputs: usize,
    output_mib: u64,
) -> Result<Value, Failure> {
    let bytes = output_mib * MIB;
    let body = json!({
        "program": {"command": ["sh", "-c", format!("head -c {bytes} /dev/zero | tr '\\0' x")]},
        "limits": {"max_output_bytes": bytes},
    });
    let body = Arc::new(serde_json::to_vec(&body).unwrap_or_default());
    let baseline = settled_rss().await;
    let sampler = Sampler::start();
    let started = Instant::now();
    let runs: Vec<_> = (0..outputs)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move {
                request(
                    addr,
                    "POST",
                    "/v1/executions",
                    &bearer(),
                    &body,
                    64 << 10,
                    None,
                    false,
                    None,
                )
                .await
            })
        })
        .collect();
    let (mut answered, mut cut) = (0u64, 0u64);
    for r in runs {
        match r.await {
            Ok(Ok(a)) if a.status == 200 => {
                answered += a.total;
                let tail = String::from_utf8_lossy(&a.tail);
                if tail.contains("\"stdout_truncated\":true") {
                    cut += 1;
                }
            }
            Ok(Ok(a)) => return Err(fail("an execution", &a.status)),
            Ok(Err(e)) => return Err(fail("an execution", &e)),
            Err(e) => return Err(fail("an execution", &e)),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let peak = sampler.peak().await;
    let after = settled_rss().await;
    let (_, stats) = json_request(addr, "GET", "/v1/stats", &bearer(), &Value::Null)
        .await
        .map_err(|e| fail("stats", &e))?;
    let kept = stats["results"]["bytes"].as_u64().unwrap_or(0);
    let mut v = rss_figures(baseline, peak);
    let o = v.as_object_mut().expect("an object");
    o.insert("answered_mib".into(), json!(mib(answered)));
    o.insert("cut_by_budget".into(), json!(cut));
    o.insert("secs".into(), json!(round(secs)));
    o.insert("rss_after_mib".into(), json!(mib(after)));
    o.insert("kept_result_mib".into(), json!(mib(kept)));
    o.insert("kept_result_bytes".into(), json!(kept));
    Ok(v)
}

/// The readers phase.
async fn readers_run(
    addr: std::net::SocketAddr,
    readers: usize,
    file_mib: u64,
    read_secs: u64,
) -> Result<Value, Failure> {
    let (status, sandbox) = json_request(addr, "POST", "/v1/sandboxes", &bearer(), &json!({}))
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
        &bearer(),
        &json!({"program": {"command": ["truncate", "-s", file_bytes.to_string(), "big.bin"]}}),
    )
    .await
    .map_err(|e| fail("making the file", &e))?;
    if status != 200 || made["exit_code"] != 0 {
        return Err(fail("making the file", &made));
    }
    let baseline = settled_rss().await;
    let sampler = Sampler::start();
    let path = format!("/v1/sandboxes/{id}/files/big.bin");
    let deadline = Duration::from_secs(read_secs);
    let read_total = Arc::new(AtomicU64::new(0));
    let reads: Vec<_> = (0..readers)
        .map(|_| {
            let path = path.clone();
            let counter = read_total.clone();
            tokio::spawn(async move {
                let auth = bearer();
                let slow = request(
                    addr,
                    "GET",
                    &path,
                    &auth,
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
    let peak = sampler.peak().await;
    let _ = request(
        addr,
        "DELETE",
        &format!("/v1/sandboxes/{id}"),
        &bearer(),
        b"",
        4096,
        None,
        false,
        None,
    )
    .await;
    let buffered = readers as u64 * file_bytes;
    let growth = peak.saturating_sub(baseline);
    let mut v = rss_figures(baseline, peak);
    let o = v.as_object_mut().expect("an object");
    o.insert("readers".into(), json!(readers));
    o.insert("file_mib".into(), json!(file_mib));
    o.insert("read_mib".into(), json!(mib(read_total)));
    o.insert("secs".into(), json!(read_secs));
    o.insert("buffered_whole_mib".into(), json!(mib(buffered)));
    o.insert(
        "growth_vs_buffered".into(),
        json!(round3(growth as f64 / buffered.max(1) as f64)),
    );
    Ok(v)
}

pub(super) async fn memory(args: MemoryArgs, as_json: bool) -> Result<i32, Failure> {
    if args.output_mib == 0 || args.output_mib > 64 {
        return Err(crate::run::UsageError(
            "--output-mib must be 1 to 64 (the default ceiling of max_output_bytes)".into(),
        ));
    }
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = false;
    config.pool.max_size = (args.outputs + 2).max(4);
    config.server.listen = "127.0.0.1:0".into();
    config.server.api_keys = vec![ApiKey::new(KEY, "bench")];
    config.server.allowed_levels = Some(vec![IsolationLevel::None]);
    config.e2b.enabled = true;
    if args.unbounded {
        let max = paddock_core::budget::MAX_BUDGET_BYTES;
        config.limiter.max_output_bytes_per_tenant = max;
        config.limiter.max_input_bytes_per_process = 1 << 30;
        config.limiter.max_input_bytes_per_tenant = max;
        config.limiter.input_wait_ms = 60_000;
    }
    let server_config = config.server.clone();
    let e2b_config = config.e2b.clone();
    let limiter = config.limiter.clone();
    let paddock = match paddock::builder()
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
    let template = TemplateConfig {
        engine: Some(EngineName::SUBPROCESS),
        ..TemplateConfig::default()
    };
    let api = match paddock_e2b::E2bApi::new(
        paddock.clone(),
        e2b_config,
        &server_config,
        [("base".to_string(), template)].into(),
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            let _ = paddock.shutdown(Duration::ZERO).await;
            return Ok(1);
        }
    };
    let routes: paddock_pool::http::Extension = Arc::new(move |cfg| api.configure(cfg));
    let server = match paddock_pool::http::start_with(
        paddock.clone(),
        server_config.clone(),
        vec![routes],
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            let _ = paddock.shutdown(Duration::ZERO).await;
            return Ok(1);
        }
    };
    let addr = server.local_addr();
    let outcome = phases(addr, args).await;
    server.stop().await;
    let _ = paddock.shutdown(Duration::from_secs(5)).await;
    let (stdin, outputs, readers) = outcome?;

    let stdin_medians = medians(
        &stdin,
        &[
            "baseline_rss_mib",
            "peak_rss_mib",
            "peak_growth_mib",
            "peak_to_baseline",
            "accepted",
            "refused",
            "growth_answered_mib",
        ],
    );
    let outputs_medians = medians(
        &outputs,
        &[
            "baseline_rss_mib",
            "peak_rss_mib",
            "peak_growth_mib",
            "peak_to_baseline",
            "cut_by_budget",
            "rss_after_mib",
        ],
    );
    let all_answered = stdin.iter().all(|r| {
        r["other"] == 0
            && r["accepted"].as_u64().unwrap_or(0) + r["refused"].as_u64().unwrap_or(0)
                == args.inputs as u64
    });
    let kept_within = outputs.iter().all(|r| {
        r["kept_result_bytes"].as_u64().unwrap_or(u64::MAX)
            <= server_config.max_result_bytes_per_tenant
    });
    let reader_growth = readers["peak_growth_mib"].as_f64().unwrap_or(f64::MAX);
    let v = json!({
        "scenario": "memory",
        "runs": args.runs,
        "unbounded": args.unbounded,
        "stdin": {
            "calls": args.inputs,
            "message_kib": args.input_kib,
            "max_input_bytes_per_process": limiter.max_input_bytes_per_process,
            "max_input_bytes_per_tenant": limiter.max_input_bytes_per_tenant,
            "input_wait_ms": limiter.input_wait_ms,
            "median": stdin_medians,
            "each": stdin,
        },
        "outputs": {
            "executions": args.outputs,
            "output_mib_each": args.output_mib,
            "max_output_bytes_per_tenant": limiter.max_output_bytes_per_tenant,
            "kept_bound_mib": mib(server_config.max_result_bytes_per_tenant),
            "median": outputs_medians,
            "each": outputs,
        },
        "readers": readers,
        "pass": {
            "stdin_all_answered": all_answered,
            "kept_within_bound": kept_within,
            "readers_growth_under_64_mib": reader_growth < 64.0,
        },
    });
    report(&v, as_json);
    let passed = v["pass"]
        .as_object()
        .is_some_and(|p| p.values().all(|b| b == true));
    Ok(if passed { 0 } else { 1 })
}

/// The three phases in order: the stdin and outputs runs, then the readers.
async fn phases(
    addr: std::net::SocketAddr,
    args: MemoryArgs,
) -> Result<(Vec<Value>, Vec<Value>, Value), Failure> {
    // Warm the paths once, then measure.
    let _ = json_request(
        addr,
        "POST",
        "/v1/executions",
        &bearer(),
        &json!({"program": {"command": ["true"]}}),
    )
    .await;
    let mut stdin = Vec::new();
    for _ in 0..args.runs {
        stdin.push(stdin_run(addr, args.inputs, args.input_kib).await?);
    }
    let mut outputs = Vec::new();
    for _ in 0..args.runs {
        outputs.push(outputs_run(addr, args.outputs, args.output_mib).await?);
    }
    let readers = readers_run(addr, args.readers, args.file_mib, args.read_secs).await?;
    Ok((stdin, outputs, readers))
}
