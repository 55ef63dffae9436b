//! Which engine a request runs on when it names none: the one that gives the level
//! asked, that the tenant may use, and that runs the program.

use paddock_core::{EngineName, Error, ErrorCode, IsolationLevel, ProgramKind};

use super::Supervisor;

/// What the chosen engine must run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runs {
    /// An execution of this kind of program.
    Program(ProgramKind),
    /// A sandbox: commands, when an engine the tenant may use runs them at the
    /// level asked and the level asked is `none` (no preference); else whatever
    /// the level's engine runs.
    Sandbox,
}

impl Supervisor {
    /// The engine for a request that names `engine` (or none), needs `level` and
    /// runs `runs`, for `tenant`.
    ///
    /// A named engine is taken as named (the access and capability checks refuse
    /// it if need be; one that cannot run on this host is refused here, with why).
    /// Otherwise the candidates are the engines that give `level` or stronger, whose
    /// level `tenant` may use and that run the program: the default engine when it
    /// is one, else the one with the weakest isolation (on a tie, the one registered
    /// first: the built-ins subprocess, isolate, container, then the embedder's in
    /// the order added). Under API keys, where level `none` is not allowed by
    /// default, a command therefore runs on the container engine and JavaScript code
    /// on the isolate. Engines of `[engines.NAME]` are never chosen unless named (or
    /// made the default engine by the embedder).
    ///
    /// Without a candidate the error names each engine and why it cannot take the
    /// request: `INVALID_OPTIONS` when one would but `tenant` may not use its level,
    /// `CAPABILITY_NOT_SUPPORTED` when none runs the program at the level. A level
    /// no engine gives is left to the capability check (`LEVEL_NOT_SUPPORTED`).
    pub(crate) fn choose(
        &self,
        engine: Option<EngineName>,
        level: IsolationLevel,
        runs: Runs,
        tenant: Option<&str>,
    ) -> Result<EngineName, Error> {
        if let Some(kind) = engine {
            if let Some((_, why)) = self.unavailable.iter().find(|(n, _)| *n == kind) {
                return Err(Error::new(
                    ErrorCode::CapabilityNotSupported,
                    format!("{why}; run `paddock doctor` on the server"),
                ));
            }
            return Ok(kind);
        }
        let program = match runs {
            Runs::Program(p) => Some(p),
            Runs::Sandbox if level == IsolationLevel::None => Some(ProgramKind::Command),
            Runs::Sandbox => None,
        };
        if let Some(kind) = self.candidate(level, program, tenant) {
            return Ok(kind);
        }
        if runs == Runs::Sandbox {
            if let Some(kind) = self.candidate(level, None, tenant) {
                return Ok(kind);
            }
        }
        if !self
            .eligible()
            .any(|(_, e)| e.capabilities().max_level >= level)
        {
            return Ok(self.default_engine.clone());
        }
        Err(self.none_fits(level, program, tenant))
    }

    /// Engines a request that names none may get, in registration order.
    fn eligible(
        &self,
    ) -> impl Iterator<Item = (&EngineName, &std::sync::Arc<dyn paddock_core::Engine>)> {
        let mut all: Vec<_> = self
            .engines
            .iter()
            .filter(|(kind, _)| !self.by_name_only.contains(*kind) || **kind == self.default_engine)
            .collect();
        all.sort_by_key(|(kind, _)| self.registered.get(*kind).copied().unwrap_or(usize::MAX));
        all.into_iter()
    }

    /// Why the engine `kind` cannot take the request, or `None` when it can.
    fn unfit(
        &self,
        kind: &EngineName,
        level: IsolationLevel,
        program: Option<ProgramKind>,
        tenant: Option<&str>,
    ) -> Option<Unfit> {
        let caps = self.engines.get(kind)?.capabilities();
        if caps.max_level < level {
            return Some(Unfit::Level(caps.max_level));
        }
        if let Some(p) = program.filter(|p| !caps.supports_program(*p)) {
            return Some(Unfit::Program(p));
        }
        if !self
            .pipeline
            .access
            .for_tenant(tenant)
            .allows_level(caps.max_level)
        {
            return Some(Unfit::Access(caps.max_level));
        }
        None
    }

    fn candidate(
        &self,
        level: IsolationLevel,
        program: Option<ProgramKind>,
        tenant: Option<&str>,
    ) -> Option<EngineName> {
        let fits = |kind: &EngineName| self.unfit(kind, level, program, tenant).is_none();
        if self.eligible().any(|(k, _)| *k == self.default_engine) && fits(&self.default_engine) {
            return Some(self.default_engine.clone());
        }
        self.eligible()
            .filter(|(kind, _)| fits(kind))
            .min_by_key(|(_, e)| e.capabilities().max_level)
            .map(|(kind, _)| kind.clone())
    }

    /// The refusal when no engine fits: each engine, and why not.
    fn none_fits(
        &self,
        level: IsolationLevel,
        program: Option<ProgramKind>,
        tenant: Option<&str>,
    ) -> Error {
        let who = match tenant {
            Some(t) => format!("tenant `{t}`"),
            None => "callers without a tenant".to_string(),
        };
        let mut reasons = Vec::new();
        let mut only_access = false;
        for (kind, _) in self.eligible() {
            let Some(unfit) = self.unfit(kind, level, program, tenant) else {
                continue;
            };
            reasons.push(match unfit {
                Unfit::Level(max) => {
                    format!("{kind} gives isolation `{max}`, below the `{level}` asked")
                }
                Unfit::Program(p) => format!("{kind} does not run {p}"),
                Unfit::Access(max) => {
                    only_access = true;
                    format!("{kind} runs it, but its level `{max}` is not allowed for {who}")
                }
            });
        }
        for (kind, why) in &self.unavailable {
            reasons.push(format!("{kind}: {why}"));
        }
        let what = program.map_or_else(|| "the sandbox".to_string(), |p| p.to_string());
        let message = format!(
            "no engine {who} may use runs {what} at level `{level}` or above: {}; ask for an engine with `engine`, or have the operator allow its level",
            reasons.join("; ")
        );
        if only_access {
            Error::invalid_options("level", message)
        } else {
            Error::new(ErrorCode::CapabilityNotSupported, message)
        }
    }
}

/// Why an engine cannot take a request.
enum Unfit {
    /// Its strongest level is below the one asked.
    Level(IsolationLevel),
    /// It does not run the program.
    Program(ProgramKind),
    /// The tenant may not use its level.
    Access(IsolationLevel),
}
