//! Starting the container engine: finding a runtime that runs a probe container,
//! sweeping what dead Paddock processes left behind, preparing the root filesystem
//! and working out the capabilities.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use paddock_core::{
    Capabilities, EngineName, Error, ErrorCode, IsolationLevel, Language, Limits, ProgramKind,
    Result,
};

use super::runtime::{self, Runtime, RuntimeKind};
use super::{agent, bundle, probe, runner, userns};
use super::{ContainerEngine, EngineInner, RuntimeInfo, PREFIX};
use crate::host::cgroup::Hierarchy;
use crate::{ContainerConfig, OciRuntime};

static NEXT_ENGINE: AtomicU64 = AtomicU64::new(0);

impl ContainerEngine {
    /// Starts the engine with [`Limits::defaults`] as the default limits.
    pub fn new(config: &ContainerConfig) -> Result<ContainerEngine> {
        ContainerEngine::with_defaults(config, Limits::defaults())
    }

    /// Starts the engine: finds a runtime that can run a container here (a probe
    /// container runs `/bin/true`), sweeps what dead Paddock processes left behind,
    /// and prepares the root filesystem.
    pub fn with_defaults(config: &ContainerConfig, defaults: Limits) -> Result<ContainerEngine> {
        ContainerEngine::named(EngineName::CONTAINER, config, defaults)
    }

    /// Starts the engine under another name than `container` (an `[engines.NAME]`
    /// section's), with its own settings: see [`ContainerEngine::with_defaults`].
    /// Engines of one process share nothing but the host's user-namespace slots,
    /// which they take in turn.
    pub fn named(
        name: EngineName,
        config: &ContainerConfig,
        defaults: Limits,
    ) -> Result<ContainerEngine> {
        config.validate()?;
        if !config.enabled {
            return Err(Error::invalid_config(
                "container.enabled",
                "the container engine is disabled in the configuration",
            ));
        }
        let defaults = defaults.or(&Limits::defaults());
        defaults.validate("limits", true)?;
        let unavailable = |why: String| Error::new(ErrorCode::EngineFailed, why);
        // The section its settings come from, for messages.
        let section = if name == EngineName::CONTAINER {
            "container".to_string()
        } else {
            format!("engines.{name}")
        };

        // gVisor's kernel stands between the program and the host instead.
        let user_namespace = config.user_namespace && config.runtime != OciRuntime::Runsc;
        let parent = match &config.workdir_root {
            Some(p) => p.clone(),
            None if user_namespace => {
                userns::engine_parent(&std::env::temp_dir()).map_err(unavailable)?
            }
            None => std::env::temp_dir(),
        };
        std::fs::create_dir_all(&parent).map_err(|e| {
            Error::invalid_config(
                "container.workdir_root",
                format!("cannot create `{}`: {e}", parent.display()),
            )
        })?;
        let hierarchies = crate::host::cgroup::hierarchies();
        let v2_mount = crate::host::cgroup::v2_mount();
        // v1 where the memory hierarchy is mounted (hybrid hosts included: the
        // runtimes put their limits there); else the v2 hierarchy, under a placement
        // that may hand controllers down (see `host::cgroup`).
        let (own, v2, v2_controllers) = match crate::host::cgroup::own_path("memory") {
            Some(own) if hierarchies.iter().any(|h| h.controllers.iter().any(|c| c == "memory")) => {
                (own, false, Vec::new())
            }
            _ => match crate::host::cgroup::v2_container_base() {
                Ok((path, _, controllers)) => (path, true, controllers),
                Err(why) => {
                    return Err(unavailable(format!(
                        "the container engine needs the cgroup v1 `memory` hierarchy or cgroup v2 with the memory and pids controllers: {why}"
                    )))
                }
            },
        };
        let own = own.trim_end_matches('/').to_string();
        // Dead owners' filesystems first: their directories can go only once nothing
        // is mounted in them.
        crate::host::volume::sweep_stale_mounts();
        sweep_stale(&parent, &own, &hierarchies, v2_mount.as_deref(), config);

        // A random part (the tail of a UUIDv7 is random), so that nobody can take
        // the name first in a shared temp dir.
        let random = uuid::Uuid::now_v7().simple().to_string();
        let dir_name = format!(
            "{PREFIX}{}-{}-{}{}",
            std::process::id(),
            NEXT_ENGINE.fetch_add(1, Ordering::Relaxed),
            &random[random.len() - 8..],
            crate::host::owner::namespace_suffix()
        );
        let root = parent.join(&dir_name);
        if user_namespace {
            if let Some(closed) = userns::closed_ancestor(&parent) {
                return Err(unavailable(format!(
                    "`{}` is closed to other users (mode without o+x), and the containers' mapped root must pass through it to `{}`; give it o+x, or set {section}.workdir_root to a directory whose every ancestor has it",
                    closed.display(),
                    parent.display()
                )));
            }
        }
        let setup = || -> std::io::Result<()> {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            // Private: workdirs hold what containers wrote, set-uid files included,
            // and nobody else on the host may reach them. With user namespaces the
            // containers' root is another host user, which must pass through to its
            // workdir, root and bundle (mode 0711: no listing); the workdirs
            // themselves are 0700 and its own, and what the engine writes for the
            // runtime alone (config.json, the runtime's state) is 0600/0700.
            let mut dir = std::fs::DirBuilder::new();
            dir.mode(0o700);
            dir.create(&root)?;
            for d in ["state", "bundles", "sandboxes"] {
                dir.create(root.join(d))?;
            }
            if user_namespace {
                for d in [&root, &root.join("bundles"), &root.join("sandboxes")] {
                    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))?;
                }
            }
            Ok(())
        };
        setup().map_err(|e| Error::engine_io("creating the container engine's directory", e))?;
        // The sandboxes' filesystems are mounted below `sandboxes/`, which is made a
        // shared mount first: the runtime's own mount namespace (on a hybrid cgroup
        // host) is made after, as a slave, and so sees every one of them.
        let disks = {
            let disks = crate::host::volume::Disks::new(&root);
            match disks.backend() {
                None => Err(disks.notes().join("; ")),
                Some(_) => match disks.share_parent(&root.join("sandboxes")) {
                    Ok(()) => Ok(disks),
                    Err(e) => Err(format!(
                        "cannot make the sandboxes' directory a shared mount: {e}"
                    )),
                },
            }
        };
        let cleanup = |root: &Path| {
            if let Ok(d) = &disks {
                d.unshare_parent(&root.join("sandboxes"));
            }
            let _ = std::fs::remove_dir_all(root);
        };
        let (rootfs, host_usr) = match &config.rootfs {
            Some(r) => {
                if !r.is_dir() {
                    cleanup(&root);
                    return Err(Error::invalid_config(
                        &format!("{section}.rootfs"),
                        format!("`{}` is not a directory", r.display()),
                    ));
                }
                if user_namespace {
                    bundle::prepare_mount_points(r);
                }
                (r.clone(), false)
            }
            None => {
                let r = root.join("rootfs");
                if let Err(e) = bundle::generate_rootfs(&r) {
                    cleanup(&root);
                    return Err(Error::engine_io("generating the root filesystem", e));
                }
                (r, true)
            }
        };
        let cgroup_base = format!("{own}/{dir_name}");

        let mut inner = EngineInner {
            name,
            caps: Capabilities::new(IsolationLevel::Strict, &[], &[], &[]),
            defaults,
            passthrough_env: crate::env::listed_env(std::env::vars_os(), &config.env_passthrough),
            runtime: Runtime {
                kind: RuntimeKind::Crun,
                path: PathBuf::new(),
                mntns: None,
                state: root.join("state"),
                flags: Vec::new(),
            },
            info: RuntimeInfo {
                kind: RuntimeKind::Crun,
                path: PathBuf::new(),
                version: String::new(),
                private_mount_namespace: false,
                fallback_reason: None,
                user_namespace,
                platform: None,
            },
            root: root.clone(),
            rootfs,
            host_usr,
            cgroup_base,
            hierarchies,
            v2_mount,
            v2,
            v2_controllers,
            cpu_quota_us: (config.cpus * 100_000.0).round() as u64,
            seccomp: config.seccomp,
            interpreters: BTreeMap::new(),
            agent: Err("disabled by configuration (`container.warm = false`)".into()),
            agent_source: None,
            runners: None,
            disks,
            userns: None,
            egress: Err("not checked yet".into()),
            runner_demand: Default::default(),
            warm_resets: Default::default(),
        };
        if config.warm {
            match agent::find(config.agent_path.as_deref(), &root) {
                Ok((path, source)) => {
                    inner.agent = Ok(path);
                    inner.agent_source = Some(source);
                }
                Err(why) => inner.agent = Err(why),
            }
        }
        if user_namespace {
            match userns::IdRanges::new(
                &userns::lock_parent(),
                config.userns_first_id,
                config.userns_slots,
            ) {
                Ok(r) => inner.userns = Some(r),
                Err(e) => {
                    drop(inner);
                    return Err(Error::engine_io(
                        "preparing the user-namespace id ranges (container.user_namespace)",
                        e,
                    ));
                }
            }
        }

        // Try the runtimes in order; the first that runs a probe container wins.
        let mut passed_over: Vec<String> = Vec::new();
        let mut chosen = None;
        for (kind, found) in runtime::candidates(config.runtime, config.runtime_path.as_deref()) {
            let path = match found {
                Ok(p) => p,
                Err(why) => {
                    passed_over.push(why);
                    continue;
                }
            };
            let mntns = if kind == RuntimeKind::Crun && runtime::hybrid_cgroups() {
                match crate::host::netns::private_mounts_without_unified_cgroup() {
                    Ok(fd) => Some(fd),
                    Err(e) => {
                        passed_over.push(format!(
                            "crun needs a private mount namespace on this hybrid cgroup host, which could not be made: {e}"
                        ));
                        continue;
                    }
                }
            } else {
                None
            };
            inner.runtime = Runtime {
                kind,
                path: path.clone(),
                mntns,
                state: root.join("state"),
                flags: runtime::global_flags(kind, config.runsc_platform, config.seccomp),
            };
            match probe::probe(&inner) {
                Ok(()) => {
                    let version = inner
                        .runtime
                        .run_blocking(&["--version"], &root)
                        .map(|f| f.output.lines().next().unwrap_or("").to_string())
                        .unwrap_or_default();
                    chosen = Some(RuntimeInfo {
                        kind,
                        path,
                        version,
                        private_mount_namespace: inner.runtime.mntns.is_some(),
                        fallback_reason: (!passed_over.is_empty()).then(|| passed_over.join("; ")),
                        user_namespace,
                        platform: (kind == RuntimeKind::Runsc)
                            .then(|| config.runsc_platform.as_str().to_string()),
                    });
                    break;
                }
                Err(why) => passed_over.push(format!(
                    "{} could not run a container here: {why}",
                    kind.as_str()
                )),
            }
        }
        let Some(info) = chosen else {
            drop(inner);
            // One configured path is passed over once per runtime kind.
            passed_over.dedup();
            let hint = if user_namespace {
                " (containers get a user namespace: if the kernel or runtime cannot give one, set container.user_namespace = false)"
            } else {
                ""
            };
            return Err(unavailable(format!(
                "no OCI runtime can run containers on this host: {}{hint}",
                passed_over.join("; ")
            )));
        };
        if let Some(why) = &info.fallback_reason {
            tracing::warn!(runtime = info.kind.as_str(), reason = %why, "container engine fell back");
        }
        inner.info = info;

        // Interpreters as the container sees them.
        for (lang, names) in [
            (Language::Python, &["python3"][..]),
            (Language::Javascript, &["node", "nodejs"][..]),
            (Language::Shell, &["sh"][..]),
        ] {
            // The generated root binds the host's /usr, and its /bin is a link there.
            let dirs: &[&str] = if inner.host_usr {
                &["/usr/local/bin", "/usr/bin"]
            } else {
                &["/usr/local/bin", "/usr/bin", "/bin"]
            };
            'found: for dir in dirs {
                for name in names {
                    let inside = format!("{dir}/{name}");
                    let on_host = if inner.host_usr {
                        PathBuf::from(&inside)
                    } else {
                        inner.rootfs.join(inside.trim_start_matches('/'))
                    };
                    if on_host.exists() {
                        inner.interpreters.insert(lang, inside);
                        break 'found;
                    }
                }
            }
        }
        let mut programs = vec![ProgramKind::Command];
        programs.extend(inner.interpreters.keys().map(|l| ProgramKind::Code(*l)));
        let mut features = vec![
            "streaming",
            "files",
            "output_cap",
            "cgroup",
            "seccomp",
            paddock_core::engine::FEATURE_HOME,
            paddock_core::engine::FEATURE_USAGE,
        ];
        let v1_has = |controller: &str| {
            inner
                .hierarchies
                .iter()
                .any(|h| h.controllers.iter().any(|c| c == controller))
        };
        // Pausing: the v1 freezer, or `cgroup.freeze` on a pure v2 host.
        if inner.v2 || v1_has("freezer") {
            features.push("pause");
        }
        // The bundle's CPU quota binds where the runtime has a CPU controller.
        let cpu = if inner.v2 {
            inner.v2_controllers.iter().any(|c| c == "cpu")
        } else {
            v1_has("cpu")
        };
        if inner.agent.is_ok() && !inner.runtime.kind.user_space_kernel() {
            // Warm interpreters in the warm container, started by its agent.
            inner.runners = runner::RunnerSetup::prepare(&config.runners, &root.join("runners"))?;
            // In the warm container, through its agent.
            features.extend([
                paddock_core::interactive::FEATURE_PROCESS,
                paddock_core::interactive::FEATURE_TERMINAL,
                paddock_core::interactive::FEATURE_TCP,
                paddock_core::engine::FEATURE_FILEOPS,
            ]);
        }
        // Allowlists and `unrestricted`: a gateway's namespace joined by path. Not on
        // gVisor, whose own network stack would not reach the gateway's listeners.
        inner.egress = if inner.runtime.kind.user_space_kernel() {
            Err("gVisor (runsc) runs its own network stack, which does not reach the egress gateway".into())
        } else {
            crate::host::egress::gateway_config(&config.egress)?
        };
        let mut network = vec!["none"];
        if inner.egress.is_ok() {
            network.extend(["allowlist", "unrestricted"]);
        }
        inner.caps = Capabilities::new(IsolationLevel::Strict, &programs, &network, &features)
            .with_limits(&[
                "memory_bytes",
                "cpu_ms",
                "pids",
                "max_output_bytes",
                "file_size_bytes",
                "open_files",
            ])
            .with_limits(if cpu { &["cpu_millicores"] } else { &[] });
        if inner.disks.is_ok() {
            let caps = std::mem::replace(
                &mut inner.caps,
                Capabilities::new(IsolationLevel::Strict, &[], &[], &[]),
            );
            inner.caps = caps.with_limits(&["disk_bytes", "disk_files"]);
        }
        Ok(ContainerEngine {
            inner: Arc::new(inner),
        })
    }
}

/// Removes what container engines of Paddock processes that no longer run left
/// behind: their containers (killed through their cgroups), cgroups, and
/// directories (bundles, runtime state, workdirs).
fn sweep_stale(
    parent: &Path,
    own: &str,
    hierarchies: &[Hierarchy],
    v2_mount: Option<&Path>,
    config: &ContainerConfig,
) {
    let dead = |name: &str| -> bool {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            return false;
        };
        // Dead: of this pid namespace, and no such pid. The resources of Paddock
        // processes in other pid namespaces that share this temp dir and these
        // cgroups are left alone.
        crate::host::owner::owner_is_gone(rest)
    };
    // Cgroups first: killing a container's processes ends it.
    for h in hierarchies {
        let base = h.dir(own);
        if Some(h.mount_point.as_path()) == v2_mount {
            crate::host::cgroup::remove_stale_v2(&base, PREFIX);
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dead(&name) {
                let _ = crate::host::cgroup::remove_tree(&entry.path());
            }
        }
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let me = crate::host::sys::effective_uid();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !dead(&name) {
            continue;
        }
        // Only a real directory of ours: in a shared temp dir anyone can make a
        // symlink or a directory with a name like this.
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(entry.path()) {
            Ok(m) if m.file_type().is_dir() && m.uid() == me => {}
            _ => continue,
        }
        // Whatever state the runtime still holds for containers of the dead engine.
        let state = entry.path().join("state");
        if let Ok(ids) = std::fs::read_dir(&state) {
            for (kind, found) in runtime::candidates(config.runtime, config.runtime_path.as_deref())
            {
                let Ok(path) = found else { continue };
                let rt = Runtime {
                    kind,
                    path,
                    mntns: None,
                    state: state.clone(),
                    flags: Vec::new(),
                };
                for id in ids.flatten() {
                    let id = id.file_name().to_string_lossy().into_owned();
                    let _ = rt.run_blocking(&["delete", "--force", &id], parent);
                }
                break;
            }
        }
        let _ = std::fs::remove_dir_all(entry.path());
    }
}
