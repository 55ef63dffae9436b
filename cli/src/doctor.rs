//! `paddock doctor`: what this host supports.

use clap::Args;
use paddock_core::{Engine, ExecRequest, Language, Program};
use paddock_engines::cgroup::{CgroupReport, Layout};
use paddock_engines::container::ContainerEngine;
use paddock_engines::isolate::IsolateEngine;
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::{ContainerConfig, IsolateConfig, OciRuntime, SubprocessConfig};

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
                    Ok(interp) => interp.path().display().to_string(),
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
                "cgroup_layout": s.cgroup_layout.as_str(),
                "cgroups": s.cgroups.as_ref().map(cgroup_json),
                "netns": status(&s.netns),
                "disk_quota": match &s.disk {
                    Ok(backend) => serde_json::json!({"status": "ok", "backend": backend}),
                    Err(why) => serde_json::json!({"status": format!("unavailable: {why}")}),
                },
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
        for line in cgroup_lines(s.cgroup_layout, s.cgroups.as_ref()) {
            println!("{line}");
        }
        println!("  network policy `none`  : {}", status(&s.netns));
        println!(
            "  disk quota             : {}",
            match &s.disk {
                Ok(backend) => format!("ok ({backend}: a filesystem per sandbox)"),
                Err(why) => format!("unavailable: {why}"),
            }
        );
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
            println!(
                "  cgroups                : {}",
                match info["cgroups"].as_str() {
                    Some("v2") => "v2 (cgroup.kill, cgroup.freeze, memory.peak)",
                    _ => "v1 (freezer, then SIGKILL; the runtimes' limits)",
                }
            );
            let agent = &info["warm_agent"];
            let path = agent["path"].as_str().unwrap_or("?");
            match agent["source"].as_str() {
                Some("embedded") => println!(
                    "  warm containers        : ok (the static agent built into this binary, {} KiB)",
                    agent["bytes"].as_u64().unwrap_or(0) / 1024
                ),
                Some("configured") => {
                    println!("  warm containers        : ok (container.agent_path {path})")
                }
                Some(_) => println!("  warm containers        : ok (found at {path})"),
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

/// The cgroup lines of the text report: the layout, where the groups are, and
/// what the limits, the kill, the freezer and `cpu_millicores` use.
fn cgroup_lines(layout: Layout, report: Option<&CgroupReport>) -> Vec<String> {
    let layout_text = match layout {
        Layout::V1 => "v1 (one hierarchy per controller)",
        Layout::Hybrid => "hybrid (v1 controllers, and a cgroup2 mount beside them)",
        Layout::V2 => "v2 (one unified hierarchy)",
        Layout::None => "none (no cgroup hierarchy is mounted)",
    };
    let mut lines = vec![format!("  cgroup layout          : {layout_text}")];
    let Some(r) = report else {
        lines.push(
            "  freezer                : unavailable (kills fall back to repeated SIGKILL)".into(),
        );
        return lines;
    };
    let groups: Vec<String> = r.groups.iter().map(|g| g.display().to_string()).collect();
    lines.push(format!("  cgroup groups          : {}", groups.join(", ")));
    if let Some(leaf) = &r.moved_into {
        lines.push(format!(
            "  moved itself into      : {} (no processes in a group with controllers)",
            leaf.display()
        ));
    }
    lines.push(format!("  cgroup limits          : ok ({})", r.limits));
    lines.push(format!("  cgroup kill            : ok ({})", r.kill));
    let ok_or = |x: &Result<String, String>| match x {
        Ok(how) => format!("ok ({how})"),
        Err(why) => format!("unavailable: {why}"),
    };
    lines.push(format!("  freezer                : {}", ok_or(&r.freeze)));
    lines.push(format!("  cpu_millicores         : {}", ok_or(&r.cpu)));
    lines
}

/// The JSON of what the sandboxes' cgroups use.
fn cgroup_json(r: &CgroupReport) -> serde_json::Value {
    let ok_or = |x: &Result<String, String>| match x {
        Ok(how) => format!("ok ({how})"),
        Err(why) => format!("unavailable: {why}"),
    };
    serde_json::json!({
        "groups": r.groups.iter().map(|g| g.display().to_string()).collect::<Vec<_>>(),
        "limits": r.limits,
        "kill": r.kill,
        "freeze": ok_or(&r.freeze),
        "cpu_millicores": ok_or(&r.cpu),
        "moved_into": r.moved_into.as_ref().map(|p| p.display().to_string()),
    })
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
            "cgroups": engine.cgroup_version(),
            "fallback_reason": info.fallback_reason,
            "user_namespace": info.user_namespace,
            "platform": info.platform,
            "warm_agent": match (engine.agent(), engine.agent_source()) {
                (Ok(path), source) => serde_json::json!({
                    "status": "ok",
                    "path": path.display().to_string(),
                    "source": source.map(|s| s.as_str()),
                    "bytes": std::fs::metadata(path).map(|m| m.len()).ok(),
                }),
                (Err(why), _) => serde_json::json!({"status": format!("unavailable: {why}")}),
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
        "mount the cgroup v1 memory, pids and freezer hierarchies, or on cgroup v2 start Paddock in a delegated subtree with the memory and pids controllers (see docs/cgroups.md)"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup_lines_say_the_layout_the_placement_and_what_works() {
        let v2 = CgroupReport {
            layout: Layout::V2,
            groups: vec!["/sys/fs/cgroup/app.scope/paddock-1-0-ns2".into()],
            limits: "v2 memory.max, memory.swap.max, pids.max".into(),
            kill: "v2 cgroup.kill".into(),
            freeze: Ok("v2 cgroup.freeze".into()),
            cpu: Err(
                "the cgroup `/sys/fs/cgroup/app.scope` is not given the cpu controller".into(),
            ),
            moved_into: Some("/sys/fs/cgroup/app.scope/paddock-1-self-ns2".into()),
        };
        let lines = cgroup_lines(Layout::V2, Some(&v2));
        assert_eq!(
            lines[0],
            "  cgroup layout          : v2 (one unified hierarchy)"
        );
        assert_eq!(
            lines[1],
            "  cgroup groups          : /sys/fs/cgroup/app.scope/paddock-1-0-ns2"
        );
        assert!(lines[2].contains("paddock-1-self-ns2"));
        assert!(lines.contains(&"  cgroup kill            : ok (v2 cgroup.kill)".to_string()));
        assert!(lines.contains(&"  freezer                : ok (v2 cgroup.freeze)".to_string()));
        assert!(lines
            .iter()
            .any(|l| l.starts_with("  cpu_millicores         : unavailable: ")));
        // Every line keeps the report's column.
        assert!(lines.iter().all(|l| l.find(": ") == Some(25)), "{lines:?}");
        let json = cgroup_json(&v2);
        assert_eq!(json["kill"], "v2 cgroup.kill");
        assert!(json["cpu_millicores"]
            .as_str()
            .unwrap()
            .starts_with("unavailable"));
        // No cgroups: the layout, and the kill's fallback.
        let none = cgroup_lines(Layout::None, None);
        assert_eq!(none.len(), 2);
        assert!(none[0].contains("none"));
        assert!(none[1].contains("repeated SIGKILL"));
    }
}
