//! Warm interpreters inside a warm container: the subprocess engine's built-in
//! Python and Node runners, started by the container's agent on first use and kept
//! for the snippets that follow, so that a snippet in a warm container costs a
//! frame round trip instead of an interpreter start.
//!
//! The agent starts a runner as a background process of its own kind
//! (`docs/protocol.md`, section 13): its stdin, stdout, stderr and fd 3 are pipes
//! whose other ends the host holds, so the host speaks the runner protocol to it
//! directly, as the subprocess engine's warm mode does; nothing of a turn passes
//! through the agent. The agent sends the runner's pidfd back: the host watches and
//! interrupts the runner through it, and the agent reaps it.
//!
//! The rules are the subprocess engine's (`crate::subprocess::runner`; the runners themselves are `crate::warm`'s):
//! - A request runs on a runner only when it would get exactly what `python3 -c` or
//!   `node -e` gives it there: no stdin, no environment or working directory of its
//!   own (the runner was started with the sandbox's), on top of what the warm
//!   container itself requires (`ContainerSandbox::warm_fits`).
//! - A runner serves the tenant it was started for and no other: a request of
//!   another tenant replaces it first.
//! - It is replaced after `max_turns` turns, past `max_age_ms`, when its resident
//!   memory passed `max_rss_bytes`, and after any turn that did not complete with
//!   exit code 0.
//! - What a snippet left running (a child, a daemon that left its session) is killed
//!   when its turn ends; the runners and the sandbox's background processes are
//!   spared (the agent's `sweep`).
//!
//! Runners are started ahead of need (for no tenant) when a sandbox opens and at
//! each recycle, for the languages recent leases of the engine used
//! ([`RunnerDemand`]); the others start on first use.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use paddock_core::{Error, ErrorCode, ExecRequest, Language, Program, Result};

use super::sandbox::{ContainerSandbox, FileMount};
use super::warm::{ContainerRunner, WarmContainer};
use crate::warm::worker::Worker;
use crate::WarmConfig;

/// Where the runner scripts are bound inside a warm container.
const RUNNERS_INSIDE: &str = "/tmp/.paddock-runners";

/// How much the latest lease weighs in a language's [`RunnerDemand`].
pub(crate) const DEMAND_WEIGHT: f64 = 0.05;
/// The demand below which a language's runner is no longer started ahead of need:
/// from 1, after 59 leases in a row without a snippet of the language (0.95^59 ≈
/// 0.048); one lease with a snippet brings it back above for about a dozen more.
pub(crate) const DEMAND_THRESHOLD: f64 = 0.05;
/// A fresh engine's demand for every language: its first sandboxes get their
/// runners ahead of need.
pub(crate) const DEMAND_START: f64 = 1.0;

/// How recently leases used each language's runner, per engine: an exponential
/// moving average, updated at each recycle (1 when the lease ran a snippet of the
/// language in its warm container, else 0). Starting runners ahead of need is about
/// 40% of what a recycled sandbox costs; a language nobody uses stops paying it, and
/// its runner starts on first use instead.
#[derive(Debug, Default)]
pub(crate) struct RunnerDemand(parking_lot::Mutex<BTreeMap<Language, f64>>);

impl RunnerDemand {
    /// The demand for `lang`'s runner, between 0 and 1.
    pub(crate) fn of(&self, lang: Language) -> f64 {
        self.0.lock().get(&lang).copied().unwrap_or(DEMAND_START)
    }

    /// Whether `lang`'s runner is worth starting ahead of need.
    pub(crate) fn wanted(&self, lang: Language) -> bool {
        self.of(lang) >= DEMAND_THRESHOLD
    }

    /// Counts one lease, which ran snippets of `used` in its warm container, for
    /// each of `langs`.
    pub(crate) fn lease_ended(
        &self,
        langs: impl IntoIterator<Item = Language>,
        used: &std::collections::BTreeSet<Language>,
    ) {
        let mut demand = self.0.lock();
        for lang in langs {
            let d = demand.entry(lang).or_insert(DEMAND_START);
            let x = if used.contains(&lang) { 1.0 } else { 0.0 };
            *d += DEMAND_WEIGHT * (x - *d);
        }
    }
}

/// The runner scripts the engine bound into its warm containers, and the rules
/// its runners follow.
#[derive(Debug)]
pub(crate) struct RunnerSetup {
    pub(crate) config: WarmConfig,
    /// (language, the script on the host, its path inside).
    scripts: Vec<(Language, PathBuf, String)>,
}

impl RunnerSetup {
    /// Writes the scripts of `config.languages` under `dir` (readable by a
    /// container's root of any user namespace); `None` when runners are off.
    pub(crate) fn prepare(config: &WarmConfig, dir: &Path) -> Result<Option<RunnerSetup>> {
        if !config.enabled || config.languages.is_empty() {
            return Ok(None);
        }
        let written = crate::warm::scripts::write_runners(
            &config.languages,
            dir,
            "container.runners.languages",
        )?;
        let scripts = written
            .into_iter()
            .map(|(lang, path)| {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                let inside = format!("{RUNNERS_INSIDE}/{name}");
                (lang, path, inside)
            })
            .collect();
        Ok(Some(RunnerSetup {
            config: config.clone(),
            scripts,
        }))
    }

    /// The languages that have a runner.
    pub(crate) fn languages(&self) -> impl Iterator<Item = Language> + '_ {
        self.scripts.iter().map(|(l, _, _)| *l)
    }

    /// The scripts to bind into a warm container.
    pub(crate) fn mounts(&self) -> Vec<FileMount> {
        self.scripts
            .iter()
            .map(|(_, host, inside)| (host.to_string_lossy().into_owned(), inside.clone()))
            .collect()
    }

    fn script(&self, lang: Language) -> Option<&str> {
        self.scripts
            .iter()
            .find(|(l, _, _)| *l == lang)
            .map(|(_, _, inside)| inside.as_str())
    }
}

impl ContainerSandbox {
    /// Starts the warm container's runners ahead of need, for no tenant, so that the
    /// first snippet of a freshly opened sandbox runs on one (see `take_runner`):
    /// those of the languages recent leases used (see [`RunnerDemand`]). A runner
    /// that is not started here, or does not start, starts on first use.
    pub(super) async fn runners_ahead(&self) {
        // (None under runsc, whose agent has no control channel: see `mod.rs`.)
        let Some(setup) = &self.engine.runners else {
            return;
        };
        let Some(mut wc) = self.warm.lock().take() else {
            return;
        };
        if wc.wait_ready().await.is_ok() {
            if let Ok((cwd, vars)) = self.guest_env(None, &BTreeMap::new()) {
                let langs: Vec<Language> = setup.languages().collect();
                for lang in langs {
                    if !self.engine.interpreters.contains_key(&lang)
                        || wc.runners.contains_key(&lang)
                        || !self.engine.runner_demand.wanted(lang)
                    {
                        continue;
                    }
                    match self
                        .take_runner(&mut wc, lang, (&None, true), (&cwd, &vars))
                        .await
                    {
                        Ok(r) => {
                            wc.runners.insert(lang, r);
                        }
                        Err(e) => {
                            tracing::debug!(sandbox = %self.id, error = %e, "a runner did not start ahead of need");
                        }
                    }
                }
            }
        }
        let mut slot = self.warm.lock();
        if slot.is_none() {
            *slot = Some(wc);
        } else {
            // Another took its place meanwhile (it never does: creation and recycle
            // are not concurrent with executions); this one goes.
            drop(slot);
            let _ = std::thread::spawn(move || wc.close());
        }
    }
}

impl ContainerSandbox {
    /// The language and source of `request` when a runner can run it exactly (see
    /// the module's rules); the warm container must fit it too.
    pub(super) fn runner_target(&self, request: &ExecRequest) -> Option<(Language, String)> {
        // (None under runsc, whose agent has no control channel: see `mod.rs`.)
        let setup = self.engine.runners.as_ref()?;
        if request.stdin.is_some() || !request.env.is_empty() || request.cwd.is_some() {
            return None;
        }
        match &request.program {
            Program::Code { language, source }
                if setup.script(*language).is_some()
                    && self.engine.interpreters.contains_key(language) =>
            {
                Some((*language, source.clone()))
            }
            _ => None,
        }
    }

    /// The runner of `lang` in `wc` for `tenant`: the one kept there when it may
    /// serve `tenant` still, else a fresh one (whatever was kept is killed). A
    /// runner started ahead of need (for no tenant) that has served no turn may be
    /// taken by the first tenant to run code in the container when no other tenant
    /// (nor a process) ran anything there (`fresh`): it holds nothing but the
    /// runner.
    pub(super) async fn take_runner(
        &self,
        wc: &mut WarmContainer,
        lang: Language,
        (tenant, fresh): (&Option<String>, bool),
        (cwd, vars): (&str, &BTreeMap<String, String>),
    ) -> Result<ContainerRunner> {
        let setup = self
            .engine
            .runners
            .as_ref()
            .ok_or_else(|| Error::new(ErrorCode::EngineFailed, "warm runners are off"))?;
        if let Some(mut kept) = wc.runners.remove(&lang) {
            let untouched = kept.tenant.is_none() && kept.worker.turns == 0 && fresh;
            let fits = (kept.tenant == *tenant || untouched)
                && kept.worker.turns < setup.config.max_turns
                && kept.worker.started.elapsed().as_millis() < u128::from(setup.config.max_age_ms)
                && kept
                    .worker
                    .exited_within(std::time::Duration::ZERO)
                    .await
                    .is_none();
            if fits {
                kept.tenant = tenant.clone();
                return Ok(kept);
            }
            // Dropped: killed through its pidfd; the agent reaps it and kills the
            // rest of its session.
        }
        let script = setup.script(lang).ok_or_else(|| {
            Error::new(
                ErrorCode::CapabilityNotSupported,
                format!("no warm runner for {lang}"),
            )
        })?;
        let interp = self.engine.interpreters.get(&lang).ok_or_else(|| {
            Error::new(
                ErrorCode::CapabilityNotSupported,
                format!("no {lang} interpreter in this container root"),
            )
        })?;
        let (child, ours) = Worker::runner_pipes()
            .map_err(|e| Error::engine_io("making a warm runner's pipes", e))?;
        wc.next_runner += 1;
        let id = format!("runner-{lang}-{}", wc.next_runner);
        let fds = [
            child.stdio[0].as_fd(),
            child.stdio[1].as_fd(),
            child.stdio[2].as_fd(),
            child.fd3.as_fd(),
        ];
        let pidfd = wc
            .control
            .spawn_runner(
                &id,
                vec![interp.clone(), script.to_string()],
                vars.clone(),
                cwd.to_string(),
                &fds,
            )
            .await?;
        // The agent's child holds its ends now; ours go, so that EOF is the runner's.
        drop(child);
        let worker = Worker::adopt(pidfd, ours).map_err(|e| {
            Error::new(
                ErrorCode::SpawnFailed,
                format!("the warm {lang} runner in the container did not start: {e}"),
            )
        })?;
        Ok(ContainerRunner {
            worker,
            tenant: tenant.clone(),
        })
    }

    /// Whether a runner's turn left anything running in `wc`: a process of the
    /// container other than its init (the agent) and the runners, `runner` (the
    /// one that ran the turn) included. Read from the container's process list, so
    /// that the usual turn, which leaves nothing, costs no round trip to the agent.
    /// (The sandbox's background processes count as leftovers here: the agent's
    /// sweep spares them.)
    /// When the process list cannot be read, anything may be left: `true` (the
    /// agent's sweep then decides).
    pub(super) fn left_running(&self, wc: &WarmContainer, runner: &ContainerRunner) -> bool {
        let Some(dir) = wc.dir("pids").or_else(|| wc.dir("memory")) else {
            return true;
        };
        let init = std::fs::read_to_string(wc.pid_file())
            .ok()
            .and_then(|s| s.trim().parse::<libc::pid_t>().ok());
        let mut keep: Vec<libc::pid_t> = wc
            .runners
            .values()
            .chain(std::iter::once(runner))
            .filter_map(|r| r.worker.pid())
            .collect();
        keep.extend(init);
        let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
            return true;
        };
        procs
            .lines()
            .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
            .any(|pid| !keep.contains(&pid))
    }
}
