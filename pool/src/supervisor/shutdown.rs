//! Shutdown: new work refused, running executions drained then cancelled, sessions
//! ended, and pools closed.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::lifecycle::end_session;
use super::{Session, Supervisor};
use crate::engine_pool::EnginePool;
use crate::messages::*;

impl Handler<Shutdown> for Supervisor {
    type Result = ResponseActFuture<Self, ShutdownReport>;

    fn handle(&mut self, msg: Shutdown, _ctx: &mut Self::Context) -> Self::Result {
        let shared = self.pipeline.shared.clone();
        shared.stopping.store(true, Ordering::Release);
        let audit = self.pipeline.audit.clone();
        let in_flight_at_start = shared.running.len();
        let sessions: Vec<Rc<Session>> = self.sessions.drain().map(|(_, s)| s).collect();
        let parked = self.pipeline.parking.borrow_mut().drain();
        let pools: Vec<Arc<EnginePool>> = self.pools.values().cloned().collect();
        Box::pin(
            async move {
                let deadline = Instant::now() + msg.drain;
                while !shared.running.is_empty() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let mut cancelled = 0;
                for entry in shared.running.iter() {
                    if entry.value().token.cancel() {
                        cancelled += 1;
                    }
                }
                // Cancelled executions finish promptly; give them a moment to record.
                let grace = Instant::now() + Duration::from_secs(10);
                while !shared.running.is_empty() && Instant::now() < grace {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let destroyed = sessions.len();
                futures_util::future::join_all(sessions.into_iter().map(end_session)).await;
                for p in parked {
                    p.retire();
                }
                for p in &pools {
                    p.close();
                }
                let _ = audit.send(crate::audit::Flush).await;
                ShutdownReport {
                    drained: in_flight_at_start.saturating_sub(cancelled),
                    cancelled,
                    sandboxes_destroyed: destroyed,
                }
            }
            .into_actor(self),
        )
    }
}
