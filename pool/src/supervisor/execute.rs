//! Executions outside sessions: routing one to its pool (or to the instance a resumed
//! execution suspended on), and cancelling one that runs.

use actix::prelude::*;
use paddock_core::{EngineName, Error, ExecResult, ExecutionId};

use super::choice::Runs;
use super::{Shared, Supervisor};
use crate::caller::Caller;
use crate::engine_pool::DiskKey;
use crate::messages::*;
use crate::pipeline::Target;

impl Handler<Execute> for Supervisor {
    type Result = ResponseFuture<Result<ExecResult, Error>>;

    fn handle(&mut self, msg: Execute, _ctx: &mut Self::Context) -> Self::Result {
        self.execute(msg, None)
    }
}

impl Handler<Proven<Execute>> for Supervisor {
    type Result = ResponseFuture<Result<ExecResult, Error>>;

    fn handle(&mut self, msg: Proven<Execute>, _ctx: &mut Self::Context) -> Self::Result {
        self.execute(msg.msg, Some(msg.proven))
    }
}

impl Supervisor {
    /// Routes one execution to its pool (or, for a resume, to the instance its
    /// execution suspended on) and runs it through the pipeline. The request is
    /// validated first, once ([`Pipeline::check_request`](crate::pipeline::Pipeline::check_request)),
    /// and `proven` told so before anything else can refuse it.
    fn execute(
        &mut self,
        msg: Execute,
        proven: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> ResponseFuture<Result<ExecResult, Error>> {
        let Execute { order, sink } = msg;
        let request = match self.pipeline.check_request(order.request) {
            Ok(valid) => valid,
            Err(e) => {
                let e = self.refuse(e);
                return Box::pin(async move { Err(e) });
            }
        };
        if let Some(proven) = proven {
            let _ = proven.send(());
        }
        if let paddock_core::Program::Resume { token_id, .. } = &request.program {
            // A resume goes to the instance its execution suspended on.
            let parking = self.pipeline.parking.borrow();
            let routed = match parking.pool_of(&request.tenant, token_id) {
                Some(pool) if order.engine.is_some_and(|e| e != pool.kind) => Err(Error::invalid_options(
                    "engine",
                    format!(
                        "token `{token_id}` belongs to an execution on the {} engine; name that engine or none",
                        pool.kind
                    ),
                )),
                Some(pool) => Ok(pool),
                None => Err(parking.not_found_error(&request.tenant, token_id)),
            };
            drop(parking);
            return match routed {
                Ok(pool) => {
                    let kind = pool.kind.clone();
                    Box::pin(self.pipeline.clone().run(
                        Target::Parked,
                        request,
                        kind,
                        sink,
                        order.traceparent,
                    ))
                }
                Err(e) => {
                    let e = self.refuse(e);
                    Box::pin(async move { Err(e) })
                }
            };
        }
        // An execution's own disk quota picks (or makes) a pool of its own: its
        // limits were checked above, so a refused request never makes or replaces one.
        let disk = DiskKey::of(&request.limits);
        let tenant = request.tenant.clone();
        let prepared = self
            .allowed_pool(
                order.engine,
                order.level,
                Runs::Program(request.program.kind()),
                &order.network,
                disk,
                None,
                tenant.as_deref(),
            )
            .and_then(|pool| {
                let caps = pool.engine().capabilities();
                caps.check_level(&pool.kind, order.level)?;
                caps.check_program(&pool.kind, request.program.kind())?;
                Ok(pool)
            });
        let pool = match prepared {
            Ok(p) => p,
            Err(e) => {
                let e = self.refuse(e);
                return Box::pin(async move { Err(e) });
            }
        };
        let pipeline = self.pipeline.clone();
        let kind = pool.kind.clone();
        Box::pin(pipeline.run(
            Target::Pool(pool),
            request,
            kind,
            sink,
            order.traceparent,
        ))
    }
}

impl Handler<CheckAdmission> for Supervisor {
    type Result = Result<EngineName, Error>;

    /// What an execution would be refused for before it runs, with the functions
    /// the scheduled path uses (the request's shape, the operator's ceilings, what
    /// the tenant may ask for, the engine's choice and capabilities), without
    /// making a pool or taking a permit.
    fn handle(&mut self, msg: CheckAdmission, _ctx: &mut Self::Context) -> Self::Result {
        let paddock_core::ExecOrder {
            request,
            engine,
            level,
            network,
            ..
        } = &msg.0.order;
        let tenant = request.tenant.as_deref();
        request.validate()?;
        paddock_core::tenancy::check_ceilings(&self.pipeline.ceilings, &request.limits, "limits")?;
        let allowed = self.pipeline.access.for_tenant(tenant);
        allowed.check_network(network, tenant)?;
        network.rules("network")?;
        let program = request.program.kind();
        let kind = self.choose(engine.clone(), *level, Runs::Program(program), tenant)?;
        let caps = self.configured(&kind)?.capabilities().clone();
        caps.check_network(&kind, network)?;
        allowed.check_level(caps.max_level, kind.as_str(), tenant)?;
        caps.check_level(&kind, *level)?;
        caps.check_program(&kind, program)?;
        caps.check_limits(&kind, &request.limits, "limits")?;
        Ok(kind)
    }
}

impl Handler<Cancel> for Supervisor {
    type Result = bool;

    fn handle(&mut self, msg: Cancel, _ctx: &mut Self::Context) -> bool {
        self.note_operator(&msg.caller, "execution.cancel", Some(msg.id.to_string()));
        cancel_running(&self.pipeline.shared, &msg.caller, &msg.id)
    }
}

/// Cancels a running execution through the shared registry, if `caller` may see it:
/// another tenant's execution is not cancelled, exactly like an unknown id.
pub(crate) fn cancel_running(shared: &Shared, caller: &Caller, id: &ExecutionId) -> bool {
    match shared.running.get(id) {
        Some(r) if caller.sees(r.tenant.as_deref()) => r.token.cancel(),
        _ => false,
    }
}
