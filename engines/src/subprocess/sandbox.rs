//! A subprocess sandbox: a workdir, a cgroup, a network namespace, and the executions
//! running in them.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use paddock_core::lifecycle::{Lifecycle, Teardown};
use paddock_core::{EngineName, Error, NetworkPolicy, Result, SandboxSpec};
use tokio::sync::{Mutex, Notify};

use super::EngineInner;
use crate::host::cgroup::Cgroup;
use crate::host::workdir::Workdir;
use crate::sandbox::{FileOps, WorkdirBacked};
use crate::task::blocking;

/// A sandbox of the subprocess engine. Executions in one sandbox run one at a time,
/// so that everything a run leaves behind in the cgroup can be killed when it ends.
#[derive(Debug)]
pub struct SubprocessSandbox {
    pub(super) id: String,
    pub(super) engine: Arc<EngineInner>,
    pub(super) spec: SandboxSpec,
    pub(super) workdir: Arc<Workdir>,
    pub(super) cgroup: Option<Arc<Cgroup>>,
    pub(super) netns: Option<OwnedFd>,
    /// The egress gateway of an `allowlist` network: its namespace is the one the
    /// sandbox's programs join. Dropped at teardown, which stops its servers (any
    /// process left in the namespace then reaches nothing).
    pub(super) egress: parking_lot::Mutex<Option<Arc<paddock_egress::Gateway>>>,
    /// The mount namespace that shows the workdir at the spec's `home`, when it has
    /// one (dropped at teardown, before the workdir goes).
    pub(super) mntns: parking_lot::Mutex<Option<OwnedFd>>,
    /// Serializes executions.
    pub(super) run_lock: Mutex<()>,
    /// Executions admitted and not yet returned (waiting or running).
    pub(super) active: AtomicUsize,
    /// Who has run code in the sandbox so far (whether a runner started ahead of
    /// need is untouched by others: see `runner`).
    pub(super) touch: parking_lot::Mutex<Touch>,
    /// Live → destroying → destroyed; admits operations and runs the teardown once.
    pub(super) lifecycle: Lifecycle,
    /// Woken when destroy starts, so running executions kill their programs.
    pub(super) destroy_signal: Notify,
    /// Warm workers by language (taken out while they serve a turn).
    pub(super) warm: Arc<super::workers::WarmSlots>,
    /// Set when it was opened in a burst, which left the runners the fork server
    /// does not give to start after the burst (see `warm_after_burst`).
    pub(super) warm_later: AtomicBool,
    /// Invocations suspended on a token, by token.
    pub(super) suspended:
        parking_lot::Mutex<std::collections::HashMap<String, super::workers::Suspension>>,
    /// The cgroup warm workers run in, apart from cold executions so that the sweep
    /// after a cold execution does not kill them.
    pub(super) warm_cgroup: Option<Arc<Cgroup>>,
    /// Background processes and terminals.
    pub(super) processes: crate::interactive::Processes,
    /// Its leases: runners started ahead of need that a lease leaves unused are
    /// retired (see `leased`).
    pub(super) leases: Arc<crate::lease::LeaseClock>,
}

/// The sandboxes of an engine being opened right now, and how many were begun.
#[derive(Debug, Default)]
pub(crate) struct Openings {
    count: AtomicUsize,
    /// Opens begun so far.
    begun: std::sync::atomic::AtomicU64,
}

/// How long no sandbox of the engine may have been opened before the runners a
/// burst left for later start: bursts of opens that follow each other closely
/// (sandboxes opened eight at a time, one batch after another) are one burst.
const QUIET: std::time::Duration = std::time::Duration::from_millis(250);

impl Openings {
    /// A mark to compare with later: opens begun so far, or `None` while one is
    /// under way.
    fn mark(&self) -> Option<u64> {
        let begun = self.begun.load(Ordering::Acquire);
        (self.count.load(Ordering::Acquire) == 0).then_some(begun)
    }
}

/// One sandbox being opened, counted while it lives (also when its future is
/// dropped midway).
struct Opening<'a> {
    openings: &'a Openings,
    /// How many others were being opened when it began.
    others: usize,
}

impl<'a> Opening<'a> {
    fn enter(openings: &'a Openings) -> Self {
        let others = openings.count.fetch_add(1, Ordering::AcqRel);
        openings.begun.fetch_add(1, Ordering::AcqRel);
        Opening { openings, others }
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.openings.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Who has run code in a sandbox so far.
#[derive(Debug, Default)]
pub(crate) struct Touch {
    /// Executions and processes started.
    pub(crate) runs: u64,
    /// The tenant of the first of them.
    pub(crate) first: Option<Option<String>>,
    /// Whether any other tenant (or code of a tenant not known) ran since.
    pub(crate) mixed: bool,
}

impl SubprocessSandbox {
    pub(super) async fn create(engine: Arc<EngineInner>, spec: &SandboxSpec) -> Result<Self> {
        let caps = &engine.caps;
        caps.check_level(&EngineName::SUBPROCESS, spec.level)?;
        caps.check_network(&EngineName::SUBPROCESS, &spec.network)?;
        spec.limits.validate("limits", false)?;
        if let Some(home) = &spec.home {
            paddock_core::engine::check_home("home", home)?;
            check_home_hides_nothing(&engine, home)?;
        }
        let home = spec.home.clone();
        let egress = match spec.network.rules("network")? {
            Some(rules) => match &engine.egress {
                Ok(cfg) => Some((rules, cfg.clone())),
                // Capabilities said so already; kept for a caller that skipped them.
                Err(why) => {
                    return Err(Error::new(
                        paddock_core::ErrorCode::CapabilityNotSupported,
                        format!("the subprocess engine cannot enforce an allowlist here: {why}"),
                    ))
                }
            },
            None => None,
        };

        // Counted from here: a sandbox being set up is part of a burst too.
        let openings = engine.clone();
        let opening = Opening::enter(&openings.opening);
        let id = paddock_core::ids::tagged("sp");
        let eng = engine.clone();
        let id2 = id.clone();
        let network = spec.network.clone();
        let warm = eng.warm.is_some();
        let quota = crate::host::volume::Quota::of(&spec.limits.or(&engine.defaults));
        let (workdir, cgroup, netns, warm_cgroup, mntns, gateway) =
            tokio::task::spawn_blocking(move || {
                let disk = quota
                    .filter(|_| eng.disks.backend().is_some())
                    .map(|q| (&eng.disks, q));
                let mut workdir = Workdir::create_on(&eng.workdir_root, &id2, disk)
                    .map_err(crate::host::volume::workdir_error)?;
                let mntns = match &home {
                    Some(home) => match crate::host::netns::private_home(workdir.root(), home) {
                        Ok(fd) => {
                            workdir = workdir.shown_at(Path::new(home));
                            Some(fd)
                        }
                        Err(e) => {
                            let _ = workdir.remove();
                            return Err(Error::engine_io(
                                &format!("showing the sandbox workdir at `{home}`"),
                                e,
                            ));
                        }
                    },
                    None => None,
                };
                let cgroup = match &eng.cgroups {
                    Some(root) => match root.create_group(&id2) {
                        Ok(g) => Some(g),
                        Err(e) => {
                            let _ = workdir.remove();
                            return Err(Error::engine_io("creating the sandbox cgroup", e));
                        }
                    },
                    None => None,
                };
                let netns = match network {
                    NetworkPolicy::None => match crate::host::netns::create_empty() {
                        Ok(fd) => Some(fd),
                        Err(e) => {
                            let _ = workdir.remove();
                            if let Some(g) = &cgroup {
                                let _ = g.remove();
                            }
                            return Err(Error::engine_io(
                                "creating the sandbox's empty network namespace",
                                e,
                            ));
                        }
                    },
                    _ => None,
                };
                let gateway = match egress {
                    Some((rules, cfg)) => match paddock_egress::Gateway::open(rules, &cfg) {
                        Ok(g) => Some(Arc::new(g)),
                        Err(e) => {
                            let _ = workdir.remove();
                            if let Some(g) = &cgroup {
                                let _ = g.remove();
                            }
                            return Err(Error::engine_io(
                                "opening the sandbox's egress gateway",
                                e,
                            ));
                        }
                    },
                    None => None,
                };
                let warm_cgroup = match (&eng.cgroups, warm) {
                    (Some(root), true) => match root.create_group(&format!("{id2}-warm")) {
                        Ok(g) => Some(g),
                        Err(e) => {
                            let _ = workdir.remove();
                            if let Some(g) = &cgroup {
                                let _ = g.remove();
                            }
                            return Err(Error::engine_io("creating the sandbox's warm cgroup", e));
                        }
                    },
                    _ => None,
                };
                Ok((workdir, cgroup, netns, warm_cgroup, mntns, gateway))
            })
            .await
            .map_err(|e| {
                Error::new(
                    paddock_core::ErrorCode::EngineFailed,
                    format!("sandbox setup task failed: {e}"),
                )
            })??;

        let sandbox = SubprocessSandbox {
            id,
            engine,
            spec: spec.clone(),
            workdir: Arc::new(workdir),
            cgroup: cgroup.map(Arc::new),
            netns,
            egress: parking_lot::Mutex::new(gateway),
            mntns: parking_lot::Mutex::new(mntns),
            run_lock: Mutex::new(()),
            active: AtomicUsize::new(0),
            touch: Default::default(),
            lifecycle: Lifecycle::new(),
            destroy_signal: Notify::new(),
            warm: Arc::default(),
            warm_later: AtomicBool::new(false),
            suspended: parking_lot::Mutex::new(Default::default()),
            warm_cgroup: warm_cgroup.map(Arc::new),
            processes: Default::default(),
            leases: Arc::default(),
        };
        // Interpreters start now, ahead of the first execution. In a burst of opens
        // (another sandbox of the engine is being opened too) only the forked ones:
        // the CPU goes to the sandboxes being opened. Those that have to start from
        // nothing start once the burst is over (`warm_after_burst`), or on first use
        // if that comes first.
        let burst = opening.others > 0;
        sandbox.runners_ahead(&spec.tenant, burst).await?;
        drop(opening);
        sandbox.warm_later.store(burst, Ordering::Release);
        Ok(sandbox)
    }

    /// For a sandbox opened in a burst: once no sandbox of the engine has been
    /// opened for a while (`QUIET`), starts the runners the burst left out, for the
    /// spec's tenant, if no code has run in the sandbox and no lease holds it (a
    /// leased sandbox starts what its snippets need; one recycled unused starts
    /// them all again). A pool's ready instances, made in bursts of their own, are
    /// warm in full this way, without taking the CPU from the bursts. The task
    /// looks every `QUIET` and ends as soon as the sandbox is gone, leased or used,
    /// so that no more of them wait than there are sandboxes idle in a pool. Needs
    /// a tokio runtime; without one the runners start on first use.
    pub(super) fn warm_after_burst(self: &Arc<Self>) {
        if !self.warm_later.swap(false, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let sandbox = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                let mark = match sandbox.upgrade() {
                    Some(s) if s.may_warm_later() => s.engine.opening.mark(),
                    _ => return,
                };
                tokio::time::sleep(QUIET).await;
                let Some(s) = sandbox.upgrade() else {
                    return;
                };
                if mark.is_some() && s.engine.opening.mark() == mark {
                    s.start_left_runners().await;
                    return;
                }
            }
        });
    }

    /// Whether runners a burst left out may still start ahead of need.
    fn may_warm_later(&self) -> bool {
        self.touch.lock().runs == 0 && !self.destroying() && !self.leases.in_lease()
    }

    /// See `warm_after_burst`. A runner started here that a snippet's own start
    /// overtook, or that code running meanwhile made stale, is dropped (killed); one
    /// that a lease begun meanwhile finds is its first code's to take.
    async fn start_left_runners(&self) {
        let Some(setup) = &self.engine.warm else {
            return;
        };
        let Ok(_op) = self.enter() else {
            return;
        };
        let untouched = || self.touch.lock().runs == 0;
        for key in setup.keys() {
            if !matches!(key, super::workers::WorkerKey::Runner(_)) {
                continue;
            }
            if !self.may_warm_later() {
                return;
            }
            if self.warm.lock().contains_key(&key) {
                continue;
            }
            match self.start_worker(&key, self.spec.tenant.clone()).await {
                Ok(slot) => {
                    let still = untouched() && !self.destroying();
                    let mut warm = self.warm.lock();
                    if still && !warm.contains_key(&key) {
                        warm.insert(key, slot);
                    }
                }
                Err(e) => {
                    tracing::debug!(sandbox = %self.id, error = %e, "a runner did not start after a burst of opens");
                    return;
                }
            }
        }
    }

    /// Starts the warm workers the sandbox lacks, for `tenant`, ahead of need (with
    /// `forked_only`, of the runners only those the fork server forks): at
    /// creation, and on recycle while no code has run in the sandbox (its runners
    /// may have been retired unused: see `leased`). A runner that cannot start is
    /// a broken engine; a handler may need a file the caller has not written yet,
    /// and starts on its first invocation instead.
    async fn runners_ahead(&self, tenant: &Option<String>, forked_only: bool) -> Result<()> {
        let Some(setup) = &self.engine.warm else {
            return Ok(());
        };
        for key in setup.keys() {
            let forked = setup.config.fork_server
                && key == super::workers::WorkerKey::Runner(paddock_core::Language::Python);
            if self.warm.lock().contains_key(&key)
                || (forked_only && !forked && matches!(key, super::workers::WorkerKey::Runner(_)))
            {
                continue;
            }
            match self.start_worker(&key, tenant.clone()).await {
                Ok(slot) => {
                    self.warm.lock().insert(key, slot);
                }
                Err(e) if matches!(key, super::workers::WorkerKey::Runner(_)) => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, "a handler did not start ahead of need");
                }
            }
        }
        Ok(())
    }

    /// Notes that code of `tenant` (`None`: of a tenant not known here, such as a
    /// process's) starts running in the sandbox.
    pub(super) fn touched_by(&self, tenant: Option<&Option<String>>) {
        let mut t = self.touch.lock();
        t.runs += 1;
        match (tenant, &t.first) {
            (Some(who), None) => t.first = Some(who.clone()),
            (Some(who), Some(first)) if who == first => {}
            _ => t.mixed = true,
        }
    }

    /// `lstat` of an absolute path outside the workdir, in the sandbox's mount
    /// namespace (its own view of the host's files) and as `nobody`.
    async fn stat_outside(&self, path: String) -> Result<paddock_core::FileInfo> {
        use std::path::Component;
        if path.contains('\0') {
            return Err(Error::invalid_options("path", "must not contain NUL bytes"));
        }
        if Path::new(&path)
            .components()
            .any(|c| matches!(c, Component::ParentDir))
        {
            return Err(Error::new(
                paddock_core::ErrorCode::PathEscape,
                format!("`{path}`: name the path without `..`"),
            ));
        }
        let _op = self.enter()?;
        let mntns = self
            .mntns
            .lock()
            .as_ref()
            .map(|fd| fd.try_clone())
            .transpose()
            .map_err(|e| Error::engine_io("the sandbox's mount namespace", e))?;
        blocking(move || {
            use std::os::fd::AsFd;
            let (st, target) = crate::host::netns::lstat_unprivileged(
                mntns.as_ref().map(|fd| fd.as_fd()),
                Path::new(&path),
            )
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENOTDIR) => Error::new(
                    paddock_core::ErrorCode::NotFound,
                    format!("`{path}` does not exist"),
                ),
                Some(libc::EACCES) | Some(libc::EPERM) => Error::new(
                    paddock_core::ErrorCode::PathEscape,
                    format!("`{path}` is not visible to the sandbox's programs"),
                ),
                _ => Error::engine_io(&format!("stat `{path}`"), e),
            })?;
            let target = target.map(|t| t.to_string_lossy().into_owned());
            Ok(crate::host::workdir::file_info(path, &st, target))
        })
        .await
    }

    /// Files beside the workdir that hold long sources (see `exec.rs`).
    fn source_files(&self) -> Vec<std::path::PathBuf> {
        ["py", "js", "sh"]
            .iter()
            .map(|ext| {
                self.engine
                    .workdir_root
                    .join(format!("{}.source.{ext}", self.id))
            })
            .collect()
    }

    /// Kills what is left in the cgroup and wipes or removes the workdir.
    async fn sweep(&self, remove: bool) -> Result<()> {
        let workdir = self.workdir.clone();
        let cgroup = self.cgroup.clone();
        for f in self.source_files() {
            let _ = std::fs::remove_file(f);
        }
        if !remove {
            // The usual recycle after a short execution: nothing left running and no
            // files. Two reads decide it, without a trip to the blocking pool.
            let idle = cgroup.as_ref().is_none_or(|g| !g.has_other_than(&[]));
            let empty = std::fs::read_dir(workdir.root())
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            if idle && empty {
                return Ok(());
            }
        }
        blocking(move || {
            let mut first_err = None;
            if let Some(g) = &cgroup {
                let r = if remove { g.remove() } else { g.kill_all() };
                if let Err(e) = r {
                    first_err.get_or_insert(Error::engine_io("killing the sandbox's processes", e));
                }
            }
            let r = if remove {
                workdir.remove()
            } else {
                workdir.clear()
            };
            if let Err(e) = r {
                first_err.get_or_insert(Error::engine_io("cleaning the sandbox workdir", e));
            }
            first_err.map_or(Ok(()), Err)
        })
        .await
    }
}

/// `CAPABILITY_NOT_SUPPORTED` when the tmpfs over `home`'s top directory would hide
/// what the engine runs from the host: its workdirs and runners, or an interpreter
/// (a pyenv under `/home`, say).
fn check_home_hides_nothing(engine: &super::EngineInner, home: &str) -> Result<()> {
    let top = home
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    let top = Path::new("/").join(top);
    let interpreters = engine
        .support
        .interpreters
        .values()
        .filter_map(|i| i.as_ref().ok())
        .map(|i| i.path());
    let mut needed = std::iter::once(engine.workdir_root.as_path()).chain(interpreters);
    if let Some(hidden) = needed.find(|p| p.starts_with(&top)) {
        return Err(Error::new(
            paddock_core::ErrorCode::CapabilityNotSupported,
            format!(
                "a home of `{home}` covers `{}` in the sandbox, which would hide `{}` that the subprocess engine runs from; choose a home under another top directory, or move subprocess.workdir_root (and the interpreters) out of it",
                top.display(),
                hidden.display()
            ),
        ));
    }
    Ok(())
}

crate::sandbox::workdir_sandbox! {
    impl Sandbox for SubprocessSandbox where Self: ProcessOps {
        fn id(&self) -> &str {
            &self.id
        }

        fn engine(&self) -> EngineName {
            EngineName::SUBPROCESS
        }

        fn leased(&self) {
            let Some(setup) = &self.engine.warm else {
                return;
            };
            let slots = Arc::downgrade(&self.warm);
            self.leases.leased(
                std::time::Duration::from_millis(setup.config.unused_ms),
                move || {
                    if let Some(slots) = slots.upgrade() {
                        super::workers::retire_unused(&slots);
                    }
                },
            );
        }

        async fn usage(&self) -> Result<paddock_core::SandboxUsage> {
            let _op = self.enter()?;
            let groups: Vec<_> = [&self.cgroup, &self.warm_cgroup]
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            if groups.is_empty() {
                return Err(Error::new(
                    paddock_core::ErrorCode::CapabilityNotSupported,
                    "this subprocess sandbox has no cgroup (the engine runs without cgroups), so its usage is not known",
                ));
            }
            let (workdir, limits) = (self.workdir.clone(), self.spec.limits.or(&self.engine.defaults));
            crate::task::blocking(move || {
                let used: Vec<_> = groups.iter().filter_map(|g| g.usage().ok()).collect();
                Ok(crate::sandbox::usage_of(&used, &workdir, &limits))
            })
            .await
        }

        async fn recycle(&self) -> Result<()> {
            // The lease ends: its planned retirement of unused runners is off.
            self.leases.ended();
            // Its watches end with it, whatever the workdir holds.
            self.workdir.end_watches();
            let _op = self.enter()?;
            let _guard = self.run_lock.lock().await;
            if self.destroying() {
                return Err(Error::disposed(&format!("sandbox {}", self.id)));
            }
            // The next lease starts without this one's processes and terminals.
            self.processes.kill_all(false).await;
            self.sweep(false).await?;
            // Nothing ran here yet: the next lease's first snippet is warm too, on
            // runners started for no tenant (this lease's may have been retired).
            if self.touch.lock().runs == 0 {
                self.runners_ahead(&self.spec.tenant, false).await?;
            }
            Ok(())
        }
    }
}

impl WorkdirBacked for SubprocessSandbox {
    fn workdir(&self) -> &Arc<Workdir> {
        &self.workdir
    }

    fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    fn busy(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }
}

impl FileOps for SubprocessSandbox {
    /// Inside the workdir, the workdir's; outside it, what the sandbox's programs
    /// see there (the host's files), as an unprivileged user would (never what only
    /// the host's root may read).
    async fn stat(&self, path: &str) -> Result<paddock_core::FileInfo> {
        let path = path.to_string();
        let p = Path::new(&path);
        if !p.is_absolute() || p.starts_with(self.workdir.shown_root()) {
            return self.file_op(move |w| w.stat(&path)).await;
        }
        self.stat_outside(path).await
    }
}

impl Teardown for SubprocessSandbox {
    async fn stop_running(&self) {
        // Running executions see the signal, kill their programs and return.
        self.destroy_signal.notify_waiters();
    }

    async fn teardown(&self) -> Result<()> {
        // Processes and terminals: killed, and waited for, so that their exits are
        // known when destroy returns.
        self.processes.kill_all(true).await;
        // Warm workers go first: dropping one kills its process group (a forked
        // runner's, through the fork server, which kills its session as it reaps it).
        self.warm.lock().clear();
        if let Some(g) = self.warm_cgroup.clone() {
            let _ = blocking(move || {
                g.remove()
                    .map_err(|e| Error::engine_io("removing the warm cgroup", e))
            })
            .await;
        }
        // Every process is gone: the namespace (and its hold on the workdir) goes.
        self.mntns.lock().take();
        self.egress.lock().take();
        self.sweep(true).await
    }

    /// Kills everything and removes the cgroup and workdir, blocking.
    fn teardown_now(&self) {
        self.processes.kill_now();
        self.warm.lock().clear();
        self.mntns.lock().take();
        self.egress.lock().take();
        if let Some(g) = &self.warm_cgroup {
            let _ = g.remove();
        }
        for f in self.source_files() {
            let _ = std::fs::remove_file(f);
        }
        if let Some(g) = &self.cgroup {
            let _ = g.remove();
        }
        let _ = self.workdir.remove();
    }
}

impl Drop for SubprocessSandbox {
    fn drop(&mut self) {
        self.lifecycle.teardown_unless_destroyed(self);
    }
}
