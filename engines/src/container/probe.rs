//! One-off containers outside any sandbox: the probe that tells whether a runtime
//! works here, and the `run_raw` baseline for benchmarks.

use std::time::Duration;

use super::bundle::{self, BundleSpec, CONTAINER_PATH, WORKSPACE};
use super::exec::RemoveOnDrop;
use super::EngineInner;

/// Runs `argv` in a one-off container of a bundle like an execution's (the engine's
/// default limits), straight through `<runtime> run`; blocking.
pub(super) fn run_once(
    engine: &EngineInner,
    argv: &[String],
    tag: &str,
) -> std::io::Result<(super::runtime::Finished, Duration)> {
    let id = paddock_core::ids::tagged(tag);
    let dir = engine.root.join("bundles").join(&id);
    std::fs::create_dir(&dir)?;
    let _remove = RemoveOnDrop(dir.clone());
    let workdir = engine.root.join("sandboxes");
    let cgroup = format!("{}/{id}", engine.cgroup_base);
    let env = vec![format!("PATH={CONTAINER_PATH}")];
    let limits = &engine.defaults;
    // A range of its own while it runs, as a sandbox's containers have.
    let ids = match &engine.userns {
        Some(ranges) => Some(
            ranges
                .allocate()
                .map_err(|e| std::io::Error::other(e.message))?,
        ),
        None => None,
    };
    let config = bundle::config(&BundleSpec {
        args: argv,
        env: &env,
        cwd: "/",
        rootfs: &engine.rootfs,
        host_usr: engine.host_usr,
        workdir: &workdir,
        home: WORKSPACE,
        files: &[],
        cgroups_path: &cgroup,
        memory_bytes: limits.memory_bytes,
        pids: limits.pids,
        cpu_quota_us: engine.cpu_quota_us,
        rlimits: &[("RLIMIT_CORE", 0, 0)],
        seccomp: engine.seccomp,
        hostname: "paddock",
        ids: ids.as_ref().map(|r| (r.first, r.size)),
        user_space_kernel: engine.runtime.kind.user_space_kernel(),
        netns: None,
    });
    bundle::write_config(&dir, &config)?;
    let bundle = dir.to_string_lossy().into_owned();
    let started = std::time::Instant::now();
    let finished = engine
        .runtime
        .run_blocking(&["run", "--bundle", &bundle, &id], &dir);
    let took = started.elapsed();
    engine.remove_cgroup(&cgroup);
    finished.map(|f| (f, took))
}

/// See [`super::ContainerEngine::run_raw`].
pub(super) fn run_raw(
    engine: &EngineInner,
    argv: &[String],
) -> std::io::Result<(Option<i32>, Duration)> {
    run_once(engine, argv, "raw").map(|(f, took)| (f.code, took))
}

/// Runs a probe container (`sh -c 'exit 0'`) to see whether the runtime works here;
/// the error carries what the runtime printed.
pub(super) fn probe(engine: &EngineInner) -> std::result::Result<(), String> {
    let args = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        "exit 0".to_string(),
    ];
    let (finished, _) = run_once(engine, &args, "probe").map_err(|e| e.to_string())?;
    match finished.code {
        Some(0) => Ok(()),
        code => Err(format!(
            "`{} run` exited with {code:?}: {}",
            engine.runtime.kind.as_str(),
            finished.output.chars().take(500).collect::<String>()
        )),
    }
}
