//! What the supervisor tells about itself, as the caller may see it: statistics, the
//! audit log, operator accesses.

use std::sync::atomic::Ordering;

use actix::prelude::*;
use paddock_core::{Error, ErrorCode};

use crate::audit::{AuditEntry, OperatorAccess};
use crate::messages::*;
use crate::pipeline::mailbox_error;

use super::Supervisor;

impl Handler<OpenSandboxIds> for Supervisor {
    type Result = MessageResult<OpenSandboxIds>;

    fn handle(&mut self, _msg: OpenSandboxIds, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.sessions.keys().cloned().collect())
    }
}

impl Handler<ChooseEngine> for Supervisor {
    type Result = Result<paddock_core::EngineName, Error>;

    fn handle(&mut self, msg: ChooseEngine, _ctx: &mut Self::Context) -> Self::Result {
        let runs = match msg.program {
            Some(p) => super::choice::Runs::Program(p),
            None => super::choice::Runs::Sandbox,
        };
        self.choose(msg.engine, msg.level, runs, msg.tenant.as_deref())
    }
}

impl Handler<GetLimiterStats> for Supervisor {
    type Result = ResponseFuture<Result<crate::limiter::LimiterStats, Error>>;

    fn handle(&mut self, msg: GetLimiterStats, _ctx: &mut Self::Context) -> Self::Result {
        if matches!(msg.caller, crate::Caller::Tenant(_)) {
            return Box::pin(async {
                Err(Error::new(
                    ErrorCode::NotFound,
                    "the limiter's counters are for operators and the embedder",
                ))
            });
        }
        self.note_operator(&msg.caller, "limiter_stats", None);
        let limiter = self.pipeline.limiter.clone();
        Box::pin(async move {
            limiter
                .send(crate::limiter::Stats)
                .await
                .map_err(|e| mailbox_error("limiter", e))
        })
    }
}

impl Handler<GetStats> for Supervisor {
    type Result = MessageResult<GetStats>;

    fn handle(&mut self, msg: GetStats, _ctx: &mut Self::Context) -> Self::Result {
        self.note_operator(&msg.caller, "stats", None);
        let shared = &self.pipeline.shared;
        let pools = self.pools.values().map(|p| p.stats()).collect();
        let admitting = !shared.stopping.load(Ordering::Relaxed);
        let Some(owner) = msg.caller.confined_to() else {
            return MessageResult(Stats {
                pools,
                accepted_total: Some(shared.accepted_total.load(Ordering::Relaxed)),
                refused_total: Some(shared.refused_total.load(Ordering::Relaxed)),
                in_flight: shared.running.len(),
                sandboxes: self.sessions.len(),
                suspended: self.pipeline.parking.borrow().len(),
                admitting,
                tenant: None,
            });
        };
        MessageResult(Stats {
            pools,
            accepted_total: None,
            refused_total: None,
            in_flight: shared
                .running
                .iter()
                .filter(|r| r.value().tenant.as_deref() == owner)
                .count(),
            sandboxes: self
                .sessions
                .values()
                .filter(|s| s.tenant.as_deref() == owner)
                .count(),
            suspended: self.pipeline.parking.borrow().count_for(owner),
            admitting,
            tenant: Some(owner.unwrap_or_default().to_string()),
        })
    }
}

impl Handler<SearchAudit> for Supervisor {
    type Result = ResponseFuture<Vec<AuditEntry>>;

    fn handle(&mut self, msg: SearchAudit, _ctx: &mut Self::Context) -> Self::Result {
        self.note_operator(&msg.caller, "audit.search", msg.query.tenant.clone());
        let audit = self.pipeline.audit.clone();
        let owner = msg.caller.confined_to().map(|o| o.map(str::to_owned));
        Box::pin(async move {
            audit
                .send(crate::audit::SearchFor {
                    query: msg.query,
                    owner,
                })
                .await
                .unwrap_or_default()
        })
    }
}

impl Handler<AuditStatistics> for Supervisor {
    type Result = ResponseFuture<crate::audit::AuditStats>;

    fn handle(&mut self, msg: AuditStatistics, _ctx: &mut Self::Context) -> Self::Result {
        self.note_operator(&msg.caller, "audit.statistics", None);
        let audit = self.pipeline.audit.clone();
        let owner = msg.caller.confined_to().map(|o| o.map(str::to_owned));
        Box::pin(async move {
            audit
                .send(crate::audit::StatisticsFor { owner })
                .await
                .unwrap_or_default()
        })
    }
}

impl Handler<OperatorAccesses> for Supervisor {
    type Result = ResponseFuture<Result<Vec<OperatorAccess>, Error>>;

    fn handle(&mut self, msg: OperatorAccesses, _ctx: &mut Self::Context) -> Self::Result {
        if msg.caller.confined_to().is_some() {
            return Box::pin(async {
                Err(Error::new(
                    ErrorCode::NotFound,
                    "operator accesses are shown to operator keys only",
                ))
            });
        }
        self.note_operator(&msg.caller, "audit.operator_accesses", None);
        let audit = self.pipeline.audit.clone();
        Box::pin(async move {
            audit
                .send(crate::audit::Accesses { limit: msg.limit })
                .await
                .map_err(|e| mailbox_error("audit", e))
        })
    }
}
