//! The `e2b` scenario: E2B's own Python SDK against the E2B-compatible API served in
//! this process, beside the native API measured in the same run by the same script:
//! `Sandbox.create()` + `commands.run("echo hi")` + `kill()`, a command in an open
//! sandbox, `run_code("1+1")` in a warm context, and `files.list` of a directory of
//! 100 entries against the native API's listing of it (with their ratio).
//!
//! The SDK comes from the interpreter `PADDOCK_E2B_PYTHON` names (the tests make
//! one, `target/e2b-venv/bin/python`), else `python3`; without it the scenario says
//! how to get one and fails.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::Stdio;

use paddock::PaddockConfig;
use paddock_core::{EngineName, IsolationLevel};
use paddock_e2b::TemplateConfig;
use paddock_pool::http::ApiKey;

/// The measuring script (run with the SDK's interpreter).
const SCRIPT: &str = include_str!("e2b_bench.py");
/// The API key of the scenario's one tenant.
const KEY: &str = "bench-key-0123456789abcdef";

pub(super) async fn e2b(
    engine: EngineName,
    samples: usize,
    as_json: bool,
) -> Result<i32, crate::run::UsageError> {
    let python = std::env::var("PADDOCK_E2B_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_sdk = std::process::Command::new(&python)
        .args(["-c", "import e2b, e2b_code_interpreter, httpx"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_sdk {
        eprintln!(
            "paddock bench e2b: `{python}` cannot import the E2B SDKs; make a venv with \
             `pip install e2b==2.63.0 e2b-code-interpreter==2.11.5` and set PADDOCK_E2B_PYTHON \
             to its python"
        );
        return Ok(1);
    }
    let mut config = PaddockConfig::default();
    config.server.listen = "127.0.0.1:0".into();
    config.server.api_keys = vec![ApiKey::new(KEY, "bench")];
    config.server.allowed_levels = Some(vec![
        IsolationLevel::None,
        IsolationLevel::ContextIsolated,
        IsolationLevel::Strict,
    ]);
    config.e2b.enabled = true;
    let template = |code_interpreter| TemplateConfig {
        engine: Some(engine.clone()),
        code_interpreter,
        ..TemplateConfig::default()
    };
    let templates = BTreeMap::from([
        ("base".to_string(), template(false)),
        ("code-interpreter-v1".to_string(), template(true)),
    ]);
    let server_config = config.server.clone();
    let e2b_config = config.e2b.clone();
    let paddock = match paddock::builder().config(config).start() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("paddock bench e2b: {e}");
            return Ok(1);
        }
    };
    let api = match paddock_e2b::E2bApi::new(paddock.clone(), e2b_config, &server_config, templates)
    {
        Ok(a) => a,
        Err(e) => {
            eprintln!("paddock bench e2b: {e}");
            return Ok(1);
        }
    };
    let routes_api = api.clone();
    let routes: paddock_pool::http::Extension =
        std::sync::Arc::new(move |cfg| routes_api.configure(cfg));
    let server = match paddock_pool::http::start_with(paddock.clone(), server_config, vec![routes])
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("paddock bench e2b: {e}");
            return Ok(1);
        }
    };
    let url = format!("http://{}", server.local_addr());
    let run = {
        let python = python.clone();
        let url = url.clone();
        let engine = engine.as_str().to_string();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(&python)
                .args(["-c", SCRIPT])
                .env("E2B_API_URL", &url)
                .env("E2B_SANDBOX_URL", &url)
                .env("E2B_API_KEY", KEY)
                .env("PADDOCK_BENCH_N", samples.to_string())
                .env("PADDOCK_BENCH_ENGINE", engine)
                .stderr(Stdio::inherit())
                .output()
        })
    };
    let out = run
        .await
        .map_err(|e| crate::run::UsageError(format!("running {python}: {e}")))?
        .map_err(|e| crate::run::UsageError(format!("running {python}: {e}")))?;
    api.close_all().await;
    server.stop().await;
    let _ = paddock.shutdown(std::time::Duration::from_secs(5)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = Vec::new();
    for line in stdout.lines() {
        let Ok(mut v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        v["scenario"] = "e2b".into();
        v["engine"] = engine.as_str().into();
        lines.push(v);
    }
    let mut stdout = std::io::stdout().lock();
    for v in &lines {
        if as_json {
            let _ = writeln!(stdout, "{v}");
        } else if let Some(ratio) = v["ratio_p50"].as_f64() {
            let _ = writeln!(
                stdout,
                "{:<28} {:>8.2}x p50 {:>8.2}x p99  ({} against {})",
                v["measure"].as_str().unwrap_or(""),
                ratio,
                v["ratio_p99"].as_f64().unwrap_or(0.0),
                v["of"].as_str().unwrap_or(""),
                v["against"].as_str().unwrap_or("")
            );
        } else {
            let _ = writeln!(
                stdout,
                "{:<28} {:>8.2} ms p50 {:>8.2} ms p99  ({} samples, {})",
                v["measure"].as_str().unwrap_or(""),
                v["p50_ms"].as_f64().unwrap_or(0.0),
                v["p99_ms"].as_f64().unwrap_or(0.0),
                v["samples"],
                v["engine"].as_str().unwrap_or("")
            );
        }
    }
    if !out.status.success() || lines.is_empty() {
        eprintln!(
            "paddock bench e2b: the measuring script failed ({})",
            out.status
        );
        return Ok(1);
    }
    Ok(0)
}
