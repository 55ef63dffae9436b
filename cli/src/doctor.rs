//! `paddock doctor`: what this host supports.

use clap::Args;
use paddock_core::{Engine, SubprocessConfig};
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
    if args.json {
        let v = serde_json::json!({
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
    }
    Ok(0)
}
