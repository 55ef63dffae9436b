//! `paddock doctor`: what this host supports.

use clap::Args;
use paddock_core::{Engine, ExecRequest, IsolateConfig, Language, Program, SubprocessConfig};
use paddock_engines::isolate::IsolateEngine;
use paddock_engines::subprocess::SubprocessEngine;

/// Arguments of `paddock doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `paddock doctor`; exits 0 when the subprocess engine starts.
pub(crate) async fn doctor(args: DoctorArgs) -> Result<i32, crate::run::UsageError> {
    let engine = match SubprocessEngine::new(&SubprocessConfig::default()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("paddock doctor: the subprocess engine cannot start: {e}");
            return Ok(1);
        }
    };
    let s = engine.host_support();
    let status = |r: &Result<(), String>| match r {
        Ok(()) => "ok".to_string(),
        Err(why) => format!("unavailable: {why}"),
    };
    let interpreters: Vec<(String, String)> = s
        .interpreters
        .iter()
        .map(|(lang, found)| {
            (
                lang.to_string(),
                match found {
                    Ok(path) => path.display().to_string(),
                    Err(why) => format!("missing: {why}"),
                },
            )
        })
        .collect();
    let isolate = isolate_check();
    if args.json {
        let v = serde_json::json!({
            "isolate": match &isolate {
                Ok(caps) => serde_json::json!({"status": "ok", "capabilities": caps}),
                Err(why) => serde_json::json!({"status": format!("unavailable: {why}")}),
            },
            "subprocess": {
                "cgroup": status(&s.cgroup),
                "freezer": s.freezer,
                "netns": status(&s.netns),
                "interpreters": interpreters
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                    .collect::<serde_json::Map<_, _>>(),
                "capabilities": engine.capabilities(),
            }
        });
        println!("{v}");
    } else {
        println!("subprocess engine");
        println!("  cgroup limits and kill : {}", status(&s.cgroup));
        println!(
            "  freezer                : {}",
            if s.freezer {
                "ok"
            } else {
                "unavailable (kills fall back to repeated SIGKILL)"
            }
        );
        println!("  network policy `none`  : {}", status(&s.netns));
        for (lang, found) in &interpreters {
            println!("  {lang:<23}: {found}");
        }
        println!("isolate engine (QuickJS)");
        match &isolate {
            Ok(_) => println!("  runs JavaScript        : ok"),
            Err(why) => println!("  runs JavaScript        : unavailable: {why}"),
        }
    }
    Ok(0)
}

/// Starts the isolate engine and runs `6 * 7` in a fresh runtime.
fn isolate_check() -> Result<paddock_core::Capabilities, String> {
    let engine = IsolateEngine::new(&IsolateConfig::default()).map_err(|e| e.to_string())?;
    let r = engine
        .run_blocking(ExecRequest::new(Program::code(
            Language::Javascript,
            "6 * 7",
        )))
        .map_err(|e| e.to_string())?;
    if r.value != Some(serde_json::json!(42)) {
        return Err(format!("`6 * 7` gave {:?} ({:?})", r.value, r.outcome));
    }
    Ok(engine.capabilities().clone())
}
