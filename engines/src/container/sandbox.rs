//! A container sandbox: a workdir bound at `/workspace`, a cgroup the sandbox's
//! containers live under, a warm container, and its life: create, pause, recycle,
//! destroy. Executions run in the warm container (`warm.rs`) or, when it cannot
//! serve one, in a container of their own (`exec.rs`).

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paddock_core::lifecycle::{Lifecycle, Teardown};
use paddock_core::{EngineName, Error, ErrorCode, ExecRequest, Program, Result, SandboxSpec};
use tokio::sync::{Mutex, Notify};

use super::bundle::WORKSPACE;
use super::warm::{Guest, WarmContainer};
use super::EngineInner;
use crate::host::workdir::Workdir;
use crate::sandbox::WorkdirBacked;
use crate::task::blocking;

/// A host file bound read-only into the container: (host path, path inside).
pub(super) type FileMount = (String, String);

/// How long the runtime has to exit after its container was killed before it is
/// killed too.
pub(super) const RUNTIME_GRACE: Duration = Duration::from_secs(5);
/// Sources longer than this are bound into the container from a file.
pub(super) const MAX_INLINE_SOURCE: usize = 96 * 1024;

/// A sandbox of the container engine. Executions run one at a time, each in its own
/// container over the sandbox's workdir.
#[derive(Debug)]
pub struct ContainerSandbox {
    pub(super) id: String,
    pub(super) engine: Arc<EngineInner>,
    pub(super) spec: SandboxSpec,
    pub(super) workdir: Arc<Workdir>,
    /// The sandbox's cgroup path; containers are its children.
    pub(super) cgroup: String,
    pub(super) run_lock: Mutex<()>,
    pub(super) active: AtomicUsize,
    pub(super) lifecycle: Lifecycle,
    pub(super) destroy_signal: Notify,
    pub(super) next_container: AtomicU64,
    /// The warm container (taken out while it serves a turn).
    pub(super) warm: Arc<parking_lot::Mutex<Option<WarmContainer>>>,
    /// Its leases: runners started ahead of need that a lease leaves unused are
    /// retired (see `leased`).
    pub(super) leases: Arc<crate::lease::LeaseClock>,
    /// Whether the sandbox is paused (its containers frozen).
    pub(super) paused: std::sync::atomic::AtomicBool,
    /// Background processes and terminals (in the warm container).
    pub(super) processes: crate::interactive::Processes,
    /// The current warm container's agent and pid file, also while it serves a turn.
    pub(super) guest: parking_lot::Mutex<Option<Guest>>,
    /// Whether a process or terminal ran since the last recycle (the warm container
    /// is then reset or replaced, as after an execution).
    pub(super) interactive_used: std::sync::atomic::AtomicBool,
    /// The languages of the snippets this lease ran in the warm container (for the
    /// engine's [`super::runner::RunnerDemand`], at the recycle that ends it).
    pub(super) lease_snippets:
        parking_lot::Mutex<std::collections::BTreeSet<paddock_core::Language>>,
    /// The host ids its containers' user namespace maps root onto, held while the
    /// sandbox lives.
    pub(super) id_range: Option<super::userns::IdRange>,
    /// Removals of replaced warm containers still under way (teardown waits for them).
    pub(super) removing: parking_lot::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The egress gateway of an `allowlist` network: its namespace is the one the
    /// sandbox's containers join. Dropped at teardown.
    pub(super) egress: parking_lot::Mutex<Option<Arc<paddock_egress::Gateway>>>,
}

impl ContainerSandbox {
    pub(super) async fn create(engine: Arc<EngineInner>, spec: &SandboxSpec) -> Result<Self> {
        engine.caps.check_level(&engine.name, spec.level)?;
        engine.caps.check_network(&engine.name, &spec.network)?;
        spec.limits.validate("limits", false)?;
        if let Some(home) = &spec.home {
            paddock_core::engine::check_home("home", home)?;
        }
        let home = spec.home.clone().unwrap_or_else(|| WORKSPACE.to_string());
        // `unrestricted` reaches the network through the gateway as well: the
        // containers never share the host's namespace.
        let rules = match spec.network {
            paddock_core::NetworkPolicy::Unrestricted => {
                Some(paddock_core::egress::EgressRules::unrestricted(
                    engine.egress.as_ref().is_ok_and(|c| c.allow_private),
                ))
            }
            ref other => other.rules("network")?,
        };
        let egress = match rules {
            Some(rules) => match &engine.egress {
                Ok(cfg) => Some((rules, cfg.clone())),
                Err(why) => {
                    return Err(Error::new(
                        ErrorCode::CapabilityNotSupported,
                        format!(
                            "the {} engine cannot offer network `{}` here: {why}",
                            engine.name,
                            spec.network.name()
                        ),
                    ))
                }
            },
            None => None,
        };
        // 35 characters: the container ids made from it (`{id}-{k}`, `{id}-w{k}`)
        // stay far below what the runtimes take (runsc's control socket name is
        // the tightest, at about 90).
        let id = paddock_core::ids::tagged("ct");
        let cgroup = format!("{}/{id}", engine.cgroup_base);
        let id_range = match &engine.userns {
            Some(ranges) => Some(ranges.allocate()?),
            None => None,
        };
        let owner = id_range.as_ref().map(|r| r.first);
        let eng = engine.clone();
        let (id2, cg2) = (id.clone(), cgroup.clone());
        let quota = crate::host::volume::Quota::of(&spec.limits.or(&engine.defaults));
        let (workdir, gateway) = tokio::task::spawn_blocking(move || -> Result<_> {
            let gateway = match egress {
                Some((rules, cfg)) => Some(Arc::new(
                    paddock_egress::Gateway::open(rules, &cfg)
                        .map_err(|e| Error::engine_io("opening the sandbox's egress gateway", e))?,
                )),
                None => None,
            };
            let disk = match (&eng.disks, quota) {
                (Ok(disks), Some(q)) => Some((disks, q)),
                _ => None,
            };
            let mut workdir = Workdir::create_on(&eng.root.join("sandboxes"), &id2, disk)
                .map_err(crate::host::volume::workdir_error)?
                .shown_at(Path::new(&home));
            if home != WORKSPACE {
                // Its mount point in the shared root: made once, kept (an empty
                // directory). A root of the operator's that cannot take it is
                // reported by the runtime when the first container starts.
                let _ = std::fs::create_dir_all(eng.rootfs.join(home.trim_start_matches('/')));
            }
            if let Some(first) = owner {
                // The directory bound at /workspace belongs to the container's root;
                // what the files API creates in it too.
                if let Err(e) = std::os::unix::fs::chown(workdir.root(), Some(first), Some(first)) {
                    let _ = workdir.remove();
                    return Err(Error::engine_io(
                        "giving the sandbox workdir to the container's user",
                        e,
                    ));
                }
                workdir.set_owner(first, first);
            }
            // The sandbox's memory group: the containers' parent, with their limit
            // (in v2 the one group, with the controllers handed to its containers).
            let made = if eng.v2 {
                eng.ensure_v2_group(&cg2)
            } else {
                match eng.cgroup_dir("memory", &cg2) {
                    Some(dir) => std::fs::create_dir_all(&dir),
                    None => Ok(()),
                }
            };
            if let Err(e) = made {
                let _ = workdir.remove();
                return Err(Error::engine_io("creating the sandbox cgroup", e));
            }
            Ok((workdir, gateway))
        })
        .await
        .map_err(|e| {
            Error::new(
                ErrorCode::EngineFailed,
                format!("sandbox setup failed: {e}"),
            )
        })??;
        let sandbox = ContainerSandbox {
            id,
            engine,
            spec: spec.clone(),
            workdir: Arc::new(workdir),
            cgroup,
            run_lock: Mutex::new(()),
            active: AtomicUsize::new(0),
            lifecycle: Lifecycle::new(),
            destroy_signal: Notify::new(),
            next_container: AtomicU64::new(0),
            warm: Arc::default(),
            leases: Arc::default(),
            paused: std::sync::atomic::AtomicBool::new(false),
            processes: Default::default(),
            guest: parking_lot::Mutex::new(None),
            interactive_used: std::sync::atomic::AtomicBool::new(false),
            lease_snippets: Default::default(),
            id_range,
            removing: parking_lot::Mutex::new(Vec::new()),
            egress: parking_lot::Mutex::new(gateway),
        };
        sandbox.prewarm();
        sandbox.runners_ahead().await;
        Ok(sandbox)
    }

    /// Where the workdir is mounted in its containers: the spec's home, else
    /// `/workspace`.
    pub(super) fn home(&self) -> &str {
        self.spec.home.as_deref().unwrap_or(WORKSPACE)
    }

    /// The network namespace its containers join, as a path the runtime opens: the
    /// gateway's of an allowlist or of `unrestricted` (`None`: a new, empty one).
    /// Without its gateway (torn down) such a sandbox starts nothing (fail closed).
    pub(super) fn netns_path(&self) -> Result<Option<String>> {
        if matches!(self.spec.network, paddock_core::NetworkPolicy::None) {
            return Ok(None);
        }
        use std::os::fd::AsRawFd;
        match self.egress.lock().as_ref() {
            Some(g) => Ok(Some(format!(
                "/proc/{}/fd/{}",
                std::process::id(),
                g.netns().as_raw_fd()
            ))),
            None => Err(Error::disposed(&format!("sandbox {}", self.id))),
        }
    }

    /// The (first host id, size) of the sandbox's user namespace, when it has one.
    pub(super) fn ids(&self) -> Option<(u32, u32)> {
        self.id_range.as_ref().map(|r| (r.first, r.size))
    }

    /// The host uid the container's root runs as: the first id of the sandbox's
    /// range with a user namespace, 0 without.
    pub fn host_root_uid(&self) -> u32 {
        self.ids().map_or(0, |(first, _)| first)
    }

    pub(super) fn refuse_if_paused(&self) -> Result<()> {
        if self.paused.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorCode::SandboxPaused,
                format!("sandbox {} is paused; unpause it, then retry", self.id),
            ));
        }
        Ok(())
    }

    /// Freezes (or thaws) the sandbox's freezer group: every container of the
    /// sandbox, and any started while it is frozen. The v1 freezer, or on a pure v2
    /// host `cgroup.freeze` of the sandbox's group.
    pub(super) async fn set_frozen(&self, frozen: bool) -> Result<()> {
        let v2 = self.engine.v2;
        let Some(dir) = self.engine.cgroup_dir("freezer", &self.cgroup) else {
            return Err(Error::new(
                ErrorCode::CapabilityNotSupported,
                "pausing needs the cgroup v1 freezer or cgroup v2, and neither is mounted",
            ));
        };
        let engine = self.engine.clone();
        let cgroup = self.cgroup.clone();
        blocking(move || {
            if v2 {
                engine
                    .ensure_v2_group(&cgroup)
                    .map_err(|e| Error::engine_io("creating the sandbox's group", e))?;
            } else {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| Error::engine_io("creating the sandbox's freezer group", e))?;
            }
            let set = if v2 {
                crate::host::cgroup::set_frozen_v2(&dir, frozen)
            } else {
                crate::host::cgroup::set_frozen(&dir, frozen)
            };
            set.map_err(|e| {
                Error::engine_io(
                    if frozen {
                        "freezing the sandbox"
                    } else {
                        "thawing the sandbox"
                    },
                    e,
                )
            })
        })
        .await
    }

    /// The runtime's id of the sandbox's warm container, while it has an idle one.
    pub fn warm_container_id(&self) -> Option<String> {
        self.warm.lock().as_ref().map(|w| w.id.clone())
    }

    /// Starts the warm container, when the engine has an agent; a failure leaves the
    /// sandbox cold (each execution then starts its own container).
    pub(super) fn prewarm(&self) {
        if self.engine.agent.is_err() {
            return;
        }
        match self.start_warm() {
            Ok(wc) => *self.warm.lock() = Some(wc),
            Err(e) => tracing::warn!(sandbox = %self.id, error = %e, "no warm container"),
        }
    }

    pub(super) fn start_warm(&self) -> Result<WarmContainer> {
        let k = self.next_container.fetch_add(1, Ordering::Relaxed);
        let limits = self.spec.limits.or(&self.engine.defaults);
        let netns = self.netns_path()?;
        let wc = WarmContainer::start(
            &self.engine,
            &self.cgroup,
            (
                self.workdir.root(),
                self.home(),
                self.ids(),
                netns.as_deref(),
            ),
            (format!("{}-w{k}", self.id), format!("w{k}")),
            &limits,
        )?;
        *self.guest.lock() = Some(Guest {
            control: wc.control.clone(),
            pid_file: wc.pid_file(),
            cgroup: wc.cgroup.clone(),
        });
        Ok(wc)
    }

    /// Whether `request` can run in the warm container exactly as it would in a
    /// fresh one. The warm container holds the sandbox's file-size and open-files
    /// rlimits ([`super::warm::warm_rlimits`]) and CPU quota, so a request with its
    /// own gets a container of its own; so does any execution under a CPU-time
    /// limit (its own or the default: RLIMIT_CPU would count the container's whole
    /// life), and a source too long to pass as an argument.
    pub(super) fn warm_fits(&self, request: &ExecRequest) -> bool {
        let effective = request
            .limits
            .or(&self.spec.limits)
            .or(&self.engine.defaults);
        if effective.cpu_ms.is_some() {
            return false;
        }
        let l = &request.limits;
        let short = match &request.program {
            Program::Code { source, .. } => source.len() <= MAX_INLINE_SOURCE,
            _ => true,
        };
        // A CPU quota of its own too: the warm container's was set when it started.
        short
            && l.cpu_ms.is_none()
            && l.cpu_millicores.is_none()
            && l.file_size_bytes.is_none()
            && l.open_files.is_none()
    }

    /// Notes that a process or terminal ran in the warm container.
    pub(super) fn mark_used(&self) {
        self.interactive_used.store(true, Ordering::Release);
    }
}

crate::sandbox::workdir_sandbox! {
    impl Sandbox for ContainerSandbox where Self: ProcessOps {
        fn id(&self) -> &str {
            &self.id
        }

        fn engine(&self) -> EngineName {
            self.engine.name.clone()
        }

        async fn usage(&self) -> Result<paddock_core::SandboxUsage> {
            let _op = self.enter()?;
            // The sandbox's group holds its containers' groups: the kernel counts
            // them in it (hierarchically, on v1 as on v2).
            let engine = self.engine.clone();
            let (cgroup, workdir) = (self.cgroup.clone(), self.workdir.clone());
            let limits = self.spec.limits.or(&self.engine.defaults);
            blocking(move || {
                let group = if engine.v2 {
                    engine.v2_dir(&cgroup).and_then(|d| {
                        let read = |p: &std::path::Path| std::fs::read_to_string(p);
                        crate::host::cgroup::read_v2_usage(&read, &d).ok()
                    })
                } else {
                    engine.cgroup_dir("memory", &cgroup).and_then(|m| {
                        let cpu = engine.cgroup_dir("cpuacct", &cgroup);
                        crate::host::cgroup::read_v1_usage(&m, cpu.as_deref()).ok()
                    })
                };
                // No group yet: no container has run, nothing is used.
                let groups: Vec<_> = group.into_iter().collect();
                Ok(crate::sandbox::usage_of(&groups, &workdir, &limits))
            })
            .await
        }

        fn leased(&self) {
            let Some(setup) = &self.engine.runners else {
                return;
            };
            let warm = Arc::downgrade(&self.warm);
            self.leases
                .leased(Duration::from_millis(setup.config.unused_ms), move || {
                    // A warm container serving a turn is not in the slot, and keeps them.
                    let Some(warm) = warm.upgrade() else {
                        return;
                    };
                    let retired = warm
                        .lock()
                        .as_mut()
                        .map(|wc| wc.retire_unused_runners())
                        .unwrap_or_default();
                    // Killed through their pidfds, outside the lock.
                    drop(retired);
                });
        }

        async fn recycle(&self) -> Result<()> {
            // The lease ends: its planned retirement of unused runners is off.
            self.leases.ended();
            let _op = self.enter()?;
            let _guard = self.run_lock.lock().await;
            if self.destroying() {
                return Err(Error::disposed(&format!("sandbox {}", self.id)));
            }
            if self.paused.load(Ordering::Acquire) {
                self.set_frozen(false).await?;
                self.paused.store(false, Ordering::Release);
            }
            if let Some(setup) = &self.engine.runners {
                let ran = std::mem::take(&mut *self.lease_snippets.lock());
                self.engine
                    .runner_demand
                    .lease_ended(setup.languages(), &ran);
            }
            // A container an execution ran in may hold what it left in /tmp, in its
            // IPC namespace or in its processes' memory: the next lease (maybe another
            // tenant's) gets it as a fresh one, reset in place by its agent, or a new one
            // when it cannot be (see `renew_warm`), here, off that lease's path.
            let used = self.warm.lock().as_ref().is_some_and(|w| w.used)
                | self.interactive_used.swap(false, Ordering::AcqRel)
                | self.processes.has_live();
            if used {
                self.renew_warm().await;
            }
            // The next lease's first snippet is warm too: runners a fresh (or reset)
            // container lacks, or that this lease left unused and saw retired, start
            // now, for the languages recent leases used.
            self.runners_ahead().await;
            // The reset or the closing ended the container's processes; their watchers
            // finish now.
            self.processes.kill_all(false).await;
            let workdir = self.workdir.clone();
            if std::fs::read_dir(workdir.root())
                .map(|mut d| d.next().is_none())
                .unwrap_or(false)
            {
                return Ok(());
            }
            blocking(move || {
                workdir
                    .clear()
                    .map_err(|e| Error::engine_io("cleaning the sandbox workdir", e))
            })
            .await
        }


        async fn pause(&self) -> Result<()> {
            let _op = self.enter()?;
            // New executions are refused from here on; running ones freeze.
            if self.paused.swap(true, Ordering::AcqRel) {
                return Ok(());
            }
            let frozen = self.set_frozen(true).await;
            if frozen.is_err() {
                let _ = self.set_frozen(false).await;
                self.paused.store(false, Ordering::Release);
            }
            frozen
        }

        async fn unpause(&self) -> Result<()> {
            let _op = self.enter()?;
            if !self.paused.load(Ordering::Acquire) {
                return Ok(());
            }
            self.set_frozen(false).await?;
            self.paused.store(false, Ordering::Release);
            Ok(())
        }
    }
}

impl WorkdirBacked for ContainerSandbox {
    fn workdir(&self) -> &Arc<Workdir> {
        &self.workdir
    }

    fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    fn busy(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }

    fn paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }
}

impl Teardown for ContainerSandbox {
    async fn stop_running(&self) {
        if self.paused.swap(false, Ordering::AcqRel) {
            // Frozen tasks do not die until thawed, and a running execution must see
            // the destroy.
            let _ = self.set_frozen(false).await;
        }
        self.destroy_signal.notify_waiters();
    }

    async fn teardown(&self) -> Result<()> {
        let engine = self.engine.clone();
        let cgroup = self.cgroup.clone();
        let workdir = self.workdir.clone();
        let warm = self.warm.lock().take();
        let removing = std::mem::take(&mut *self.removing.lock());
        let result = blocking(move || {
            if let Some(w) = warm {
                w.close();
            }
            // Replaced warm containers are gone too before destroy returns.
            for removal in removing {
                let _ = removal.join();
            }
            engine.remove_cgroup(&cgroup);
            workdir
                .remove()
                .map_err(|e| Error::engine_io("removing the sandbox workdir", e))
        })
        .await;
        // The container's processes and terminals died with it: their exits are
        // known before destroy returns.
        self.processes.kill_all(true).await;
        // Every container is gone: the gateway's servers stop, its namespace goes.
        self.egress.lock().take();
        result
    }

    fn teardown_now(&self) {
        if let Some(w) = self.warm.lock().take() {
            w.close();
        }
        self.processes.kill_now();
        self.engine.remove_cgroup(&self.cgroup);
        let _ = self.workdir.remove();
        self.egress.lock().take();
    }
}

impl Drop for ContainerSandbox {
    fn drop(&mut self) {
        self.lifecycle.teardown_unless_destroyed(self);
    }
}
