//! The warm workers a subprocess sandbox keeps: what the engine prepared for warm
//! mode, which workers there are, the slots a sandbox keeps them in, and the
//! invocations suspended on them. How they serve turns is `runner.rs`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use paddock_core::{Language, Result};

use crate::warm::scripts::write_runners;
use crate::warm::worker::Worker;
use crate::{HandlerConfig, WarmConfig};

/// What the engine prepared for warm mode.
#[derive(Debug)]
pub(crate) struct WarmSetup {
    pub(crate) config: WarmConfig,
    /// Runner script per language (empty when warm `Code` is off).
    pub(crate) runners: Vec<(Language, PathBuf)>,
    /// Handlers an `Invoke` may name.
    pub(crate) handlers: BTreeMap<String, HandlerConfig>,
}

/// Which worker a warm execution runs on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum WorkerKey {
    /// The built-in runner of a language.
    Runner(Language),
    /// A configured json-stdio handler, by name.
    Handler(String),
}

impl std::fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerKey::Runner(lang) => write!(f, "{lang} runner"),
            WorkerKey::Handler(name) => write!(f, "handler `{name}`"),
        }
    }
}

impl WarmSetup {
    /// Writes the runner scripts under `dir`; `None` when there is nothing to keep
    /// warm.
    pub(crate) fn prepare(
        config: &WarmConfig,
        handlers: &BTreeMap<String, HandlerConfig>,
        dir: &std::path::Path,
    ) -> Result<Option<WarmSetup>> {
        if !config.enabled && handlers.is_empty() {
            return Ok(None);
        }
        let runners = if config.enabled {
            write_runners(
                &config.languages,
                &dir.join("runners"),
                "subprocess.warm.languages",
            )?
        } else {
            Vec::new()
        };
        Ok(Some(WarmSetup {
            config: config.clone(),
            runners,
            handlers: handlers.clone(),
        }))
    }

    /// The runner script of `lang`, when warm `Code` runs it.
    pub(super) fn runner(&self, lang: Language) -> Option<&PathBuf> {
        self.runners
            .iter()
            .find(|(l, _)| *l == lang)
            .map(|(_, p)| p)
    }

    /// Every worker a new sandbox starts ahead of need.
    pub(crate) fn keys(&self) -> Vec<WorkerKey> {
        self.runners
            .iter()
            .map(|(l, _)| WorkerKey::Runner(*l))
            .chain(self.handlers.keys().cloned().map(WorkerKey::Handler))
            .collect()
    }
}

/// A sandbox's warm workers by key (a worker is taken out while it serves a turn),
/// shared with the engine's record of runners started ahead of need.
pub(crate) type WarmSlots = parking_lot::Mutex<BTreeMap<WorkerKey, Slot>>;

/// Retires the runners in `slots` that were started ahead of need and served no
/// turn (a runner started for a tenant, or one that served a turn, stays).
pub(crate) fn retire_unused(slots: &WarmSlots) {
    let retired: Vec<Slot> = {
        let mut slots = slots.lock();
        let unused: Vec<WorkerKey> = slots
            .iter()
            .filter(|(k, s)| {
                matches!(k, WorkerKey::Runner(_)) && s.tenant.is_none() && s.worker.turns == 0
            })
            .map(|(k, _)| k.clone())
            .collect();
        unused.iter().filter_map(|k| slots.remove(k)).collect()
    };
    // Killed through their pidfds, outside the lock.
    drop(retired);
}

/// A warm worker and whom it serves.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) worker: Worker,
    pub(crate) tenant: Option<String>,
    /// How many executions and processes the sandbox had started when the worker
    /// started.
    pub(crate) born: u64,
}

/// An invocation waiting for its token: which worker, which invocation id, whose.
#[derive(Debug, Clone)]
pub(crate) struct Suspension {
    pub(super) key: WorkerKey,
    pub(super) id: String,
    pub(super) tenant: Option<String>,
}
