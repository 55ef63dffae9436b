//! `paddock doctor`: what this host supports.

use clap::Args;
use paddock_core::{
    ContainerConfig, Engine, ExecRequest, IsolateConfig, Language, OciRuntime, Program,
    SubprocessConfig,
};
use paddock_engines::container::ContainerEngine;
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
    let container = container_check(OciRuntime::Auto);
    let runtimes: Vec<(&str, Result<serde_json::Value, String>)> = [
        ("crun", OciRuntime::Crun),
        ("runc", OciRuntime::Runc),
        ("runsc", OciRuntime::Runsc),
    ]
    .into_iter()
    .map(|(name, rt)| (name, container_check(rt).map(|(info, _)| info)))
    .collect();
    if args.json {
        let by_runtime: serde_json::Map<_, _> = runtimes
            .iter()
            .map(|(n, r)| {
                let v = match r {
                    Ok(info) => serde_json::json!({"status": "ok", "runtime": info}),
                    Err(why) => serde_json::json!({"status": format!("unavailable: {why}")}),
                };
                (n.to_string(), v)
            })
            .collect();
        let v = serde_json::json!({
            "container": match &container {
                Ok((info, caps)) => serde_json::json!({"status": "ok", "runtime": info,
                    "capabilities": caps, "runtimes": by_runtime}),
                Err(why) => serde_json::json!({"status": format!("unavailable: {why}"),
                    "fix": container_fix(why), "runtimes": by_runtime}),
            },
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
        println!("container engine (OCI)");
        match &container {
            Ok((info, _)) => println!(
                "  runs containers        : ok, with {} ({})",
                info["kind"].as_str().unwrap_or("?"),
                info["version"].as_str().unwrap_or("?")
            ),
            Err(why) => {
                println!("  runs containers        : unavailable: {why}");
                println!("  to fix                 : {}", container_fix(why));
            }
        }
        if let Ok((info, _)) = &container {
            let agent = &info["warm_agent"];
            match agent["path"].as_str() {
                Some(path) => println!("  warm containers        : ok ({path})"),
                None => println!(
                    "  warm containers        : {}",
                    agent["status"].as_str().unwrap_or("unavailable")
                ),
            }
        }
        if let Ok((info, _)) = &container {
            println!(
                "  user namespace         : {}",
                if info["user_namespace"] == true {
                    "on (root inside is an unprivileged host id of the sandbox's range)"
                } else {
                    "off (root inside is the host's root, held back by capabilities and seccomp)"
                }
            );
        }
        for (name, r) in &runtimes {
            match r {
                Ok(info) => println!(
                    "  {name:<23}: ok, runs a container ({}{}){}",
                    info["path"].as_str().unwrap_or("?"),
                    match info["platform"].as_str() {
                        Some(p) => format!(", platform {p}"),
                        None => String::new(),
                    },
                    if info["private_mount_namespace"] == true {
                        ", in a private mount namespace (hybrid cgroup layout)"
                    } else {
                        ""
                    }
                ),
                Err(why) => println!("  {name:<23}: unavailable: {why}"),
            }
        }
    }
    Ok(0)
}

/// Starts the container engine with `runtime` (which runs a probe container: a
/// runtime reported ok has run one) and describes the runtime it uses.
fn container_check(
    runtime: OciRuntime,
) -> Result<(serde_json::Value, paddock_core::Capabilities), String> {
    let config = ContainerConfig {
        runtime,
        ..ContainerConfig::default()
    };
    let engine = ContainerEngine::new(&config).map_err(|e| e.message)?;
    let info = engine.runtime_info();
    Ok((
        serde_json::json!({
            "kind": info.kind.as_str(),
            "path": info.path.display().to_string(),
            "version": info.version,
            "private_mount_namespace": info.private_mount_namespace,
            "fallback_reason": info.fallback_reason,
            "user_namespace": info.user_namespace,
            "platform": info.platform,
            "warm_agent": match engine.agent() {
                Ok(path) => serde_json::json!({"status": "ok", "path": path.display().to_string()}),
                Err(why) => serde_json::json!({"status": format!("unavailable: {why}")}),
            },
        }),
        engine.capabilities().clone(),
    ))
}

/// What to do about a container engine that cannot start, from its reason.
fn container_fix(why: &str) -> &'static str {
    if why.contains("is not installed") {
        "install crun (preferred) or runc, for example `apt-get install crun runc`"
    } else if why.contains("cgroup") {
        "mount the cgroup v1 memory, pids and freezer hierarchies (or run on a host that has them)"
    } else if why.contains("namespace") {
        "run Paddock as root on a kernel with user, pid, mount and network namespaces enabled"
    } else {
        "run as root; the runtime's own message above says what it could not do"
    }
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
