//! The facade's [`Federation`] calls, answered for the fleet: sessions and their
//! admission, one-shot executions (streamed or not), lookup and cancel by id, the
//! audit search and the node list.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use paddock_core::{EngineName, Error, ErrorCode, ExecResult, ExecutionId, SandboxSpec};
use paddock_pool::audit::{AuditEntry, AuditQuery};
use paddock_pool::federation::{CancelOutcome, Federation, Lookup, NodeView, SessionPlace};
use paddock_pool::{Caller, Execute, ExecutionStream};

use super::{tenant_of, Federated};
use crate::control::{ask, cancel_here};
use crate::shares::{Hold, Kind};
use crate::wire::{Control, Phase};

#[async_trait]
impl Federation for Federated {
    fn node_id(&self) -> String {
        self.inner.cx.node.clone()
    }

    fn http_forwarder(&self) -> Option<Arc<dyn paddock_pool::http::HttpForwarder>> {
        Some(Arc::new(crate::forward::NodeForwarder))
    }

    async fn place_session(
        &self,
        spec: &SandboxSpec,
        engine: Option<&EngineName>,
    ) -> Result<SessionPlace, Error> {
        crate::sessions::place(&self.inner.sessions, spec, engine).await
    }

    async fn admit_session(&self, tenant: Option<&str>, ticket: &str) -> Result<bool, Error> {
        let inner = &self.inner;
        let caps = *inner.shares.caps.lock();
        if !caps.counts_sandboxes() {
            return Ok(false);
        }
        let hold = Hold::here(&inner.shares, ticket.to_string(), ticket.to_string(), 0, 0);
        crate::shares::take(&inner.shares, &caps, tenant, Kind::Sandbox, hold).await?;
        Ok(true)
    }

    fn release_admission(&self, tenant: Option<&str>, ticket: &str) {
        let caps = *self.inner.shares.caps.lock();
        if !caps.counts_sandboxes() {
            return;
        }
        let inner = self.inner.clone();
        let tenant = tenant.map(str::to_owned);
        let ticket = ticket.to_string();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    crate::shares::give_back_or_later(
                        &inner.shares,
                        tenant.as_deref(),
                        Kind::Sandbox,
                        &ticket,
                    )
                    .await;
                });
            }
            Err(_) => crate::shares::give_back_later(
                &inner.shares,
                tenant.as_deref(),
                Kind::Sandbox,
                &ticket,
            ),
        }
    }

    async fn session_opened(
        &self,
        tenant: Option<&str>,
        id: &str,
        engine: &EngineName,
        ticket: Option<String>,
    ) -> Result<(), Error> {
        crate::sessions::opened(&self.inner.sessions, tenant, id, engine, ticket).await
    }

    async fn node_lost(&self, node: &str) -> String {
        let inner = &self.inner;
        loop {
            tokio::time::sleep(inner.cx.heartbeat()).await;
            // Declared only while this node is itself in touch with the fleet (a
            // node cut off from NATS sees every card age).
            if inner.members.card_silent_ms() > inner.cx.config.ack_wait_ms {
                continue;
            }
            let card = inner.members.seen.read().get(node).map(|s| s.card.clone());
            if crate::registry::judge_card(&inner.members, card.as_ref()).is_none() {
                continue;
            }
            // Seen lost (or not seen at all) here: confirmed from the card as the
            // bucket has it, since this node's view may lag.
            if let Ok(card) = crate::registry::read_card(&inner.members, node).await {
                if let Some(why) = crate::registry::judge_card(&inner.members, card.as_ref()) {
                    return why.to_string();
                }
            }
        }
    }

    async fn session_closed(&self, id: &str) {
        crate::sessions::closed(&self.inner.sessions, id).await
    }

    async fn session_owner(
        &self,
        caller: &Caller,
        id: &str,
        forwarded: bool,
    ) -> Result<SessionPlace, Error> {
        crate::sessions::owner(&self.inner.sessions, caller, id, forwarded).await
    }

    async fn execute(&self, msg: Execute, key: Option<String>) -> Result<ExecResult, Error> {
        let pending = self.submit(msg, key, false).await?;
        self.wait(pending, None).await
    }

    async fn execute_stream(
        &self,
        msg: Execute,
        key: Option<String>,
    ) -> Result<ExecutionStream, Error> {
        let id = msg.order.request.id.clone();
        let paddock = &self.inner.cx.paddock;
        let subscription = paddock.subscribe(id.clone()).await?;
        let relay = paddock.relay(id.clone()).await?;
        let pending = match self.submit(msg, key, true).await {
            Ok(p) => p,
            Err(e) => {
                relay.close().await;
                return Err(e);
            }
        };
        let (done, answered) = tokio::sync::oneshot::channel();
        let this = Federated {
            inner: self.inner.clone(),
        };
        tokio::spawn(async move {
            let answer = this.wait(pending, Some(&relay)).await;
            relay.close().await;
            let _ = done.send(answer);
        });
        Ok(ExecutionStream::new(subscription, async move {
            answered.await.unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorCode::EngineFailed,
                    "the fleet's wait for the result ended without one; look the execution up by id",
                ))
            })
        }))
    }

    async fn lookup(&self, caller: &Caller, id: &ExecutionId) -> Result<Option<Lookup>, Error> {
        let inner = &self.inner;
        if let Some(w) = inner.orders.waiters.get(id).map(|w| w.clone()) {
            if caller.sees(w.tenant.as_deref()) {
                return Ok(Some(Lookup::Running));
            }
            return Ok(None);
        }
        match inner.cx.records.get(id).await? {
            Some((rec, _)) => {
                if rec.forgotten || !caller.sees(rec.tenant.as_deref()) {
                    return Ok(None);
                }
                Ok(Some(match (rec.phase, &rec.answer) {
                    (Phase::Done, Some(a)) => {
                        // A result handed out has its audit entry in the stream.
                        let entry = crate::audit::of_record(&rec, a);
                        crate::audit::make_durable(&inner.cx, entry, rec.done_at_ms).await?;
                        Lookup::Finished(Arc::new(a.clone()))
                    }
                    _ => Lookup::Running,
                }))
            }
            None => {
                // Queued on another node's behalf: only that node knows it.
                let request = Control::Lookup {
                    id: id.clone(),
                    tenant: tenant_of(caller),
                };
                let known = ask(
                    &inner.cx,
                    inner.cx.names.broadcast(),
                    &request,
                    Duration::from_millis(250),
                )
                .await
                .is_some_and(|r| r.known);
                Ok(known.then_some(Lookup::Running))
            }
        }
    }

    async fn cancel(&self, caller: &Caller, id: &ExecutionId) -> Result<CancelOutcome, Error> {
        let inner = &self.inner;
        let tenant = tenant_of(caller);
        let here = cancel_here(&inner.orders, id, &tenant, true).await;
        if here.known {
            return Ok(CancelOutcome {
                known: true,
                cancelled: here.cancelled,
            });
        }
        match inner.cx.records.get(id).await? {
            Some((rec, rev)) => {
                if rec.forgotten || !caller.sees(rec.tenant.as_deref()) {
                    return Ok(CancelOutcome {
                        known: false,
                        cancelled: false,
                    });
                }
                match rec.phase {
                    Phase::Running | Phase::Released => {
                        let r = crate::control::cancel_recorded(
                            &inner.orders,
                            rec.clone(),
                            Some((rec, rev)),
                            &tenant,
                            true,
                        )
                        .await;
                        Ok(CancelOutcome {
                            known: true,
                            cancelled: r.cancelled,
                        })
                    }
                    Phase::Done => {
                        // Forget it: the record stays, and keeps fencing.
                        let mut forgotten = rec.clone();
                        forgotten.forgotten = true;
                        let _ = inner.cx.records.update(&forgotten, rev).await?;
                        Ok(CancelOutcome {
                            known: true,
                            cancelled: false,
                        })
                    }
                }
            }
            None => {
                let request = Control::Cancel {
                    id: id.clone(),
                    tenant: tenant.clone(),
                    forget: true,
                };
                let r = ask(
                    &inner.cx,
                    inner.cx.names.broadcast(),
                    &request,
                    Duration::from_millis(500),
                )
                .await
                .unwrap_or_default();
                Ok(CancelOutcome {
                    known: r.known,
                    cancelled: r.cancelled,
                })
            }
        }
    }

    async fn audit(&self, caller: &Caller, query: AuditQuery) -> Result<Vec<AuditEntry>, Error> {
        crate::audit::search(&self.inner.cx, caller, query).await
    }

    async fn nodes(&self, caller: &Caller) -> Result<Vec<NodeView>, Error> {
        let operator = caller.confined_to().is_none();
        Ok(crate::registry::views(&self.inner.members, operator))
    }
}
