//! Opening and closing a sandbox session in a fleet, for every surface: the place in
//! the tenant's fleet-wide shares is taken before the sandbox opens (a tenant at its
//! cap costs no sandbox), and its owner is recorded before anyone learns its id (a
//! sandbox the fleet cannot find is never handed out). Placement on another node is
//! the HTTP surface's (it forwards the request); everything else is here, behind
//! [`Paddock::open_sandbox`] and [`SandboxHandle::destroy`](super::SandboxHandle::destroy).

use std::sync::Arc;

use paddock_core::{EngineName, Error, ErrorCode, SandboxSpec};

use super::{Paddock, SandboxHandle};
use crate::federation::Federation;

/// A place in the fleet's shares taken for a sandbox being opened: given back when
/// dropped still holding its ticket (the sandbox did not open, or the open ended
/// first).
struct Admission {
    federation: Arc<dyn Federation>,
    tenant: Option<String>,
    ticket: Option<String>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.federation
                .release_admission(self.tenant.as_deref(), &t);
        }
    }
}

impl Paddock {
    /// Opens a sandbox on this node, in `federation`'s fleet: admitted, opened and
    /// recorded in a task of its own where there is a Tokio runtime, which ends
    /// however the caller's future does: a caller that goes away midway neither
    /// leaks its place in the fleet's shares nor leaves an open sandbox uncounted
    /// (it is reclaimed when idle, as on a single node).
    pub(super) async fn open_in_fleet(
        &self,
        federation: Arc<dyn Federation>,
        spec: SandboxSpec,
        engine: Option<EngineName>,
    ) -> Result<SandboxHandle, Error> {
        let this = self.clone();
        let open = async move { this.admit_open_record(federation, spec, engine).await };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime.spawn(open).await.map_err(|e| {
                Error::new(
                    ErrorCode::EngineFailed,
                    format!("opening the sandbox ended early ({e}); retry"),
                )
            })?,
            Err(_) => open.await,
        }
    }

    async fn admit_open_record(
        &self,
        federation: Arc<dyn Federation>,
        spec: SandboxSpec,
        engine: Option<EngineName>,
    ) -> Result<SandboxHandle, Error> {
        // The ticket is in the guard before the place is asked for, so that whatever
        // was taken is given back if the sandbox does not open.
        let mut admission = Admission {
            federation: federation.clone(),
            tenant: spec.tenant.clone(),
            ticket: Some(paddock_core::ExecutionId::new().to_string()),
        };
        let ticket = admission.ticket.clone().unwrap_or_default();
        match federation
            .admit_session(spec.tenant.as_deref(), &ticket)
            .await
        {
            Ok(true) => {}
            // The fleet counts no shares, or refused: nothing was taken.
            Ok(false) => admission.ticket = None,
            Err(e) => {
                admission.ticket = None;
                return Err(e);
            }
        }
        let handle = self.open_local(spec.clone(), engine).await?;
        let recorded = federation
            .session_opened(
                spec.tenant.as_deref(),
                handle.id(),
                &handle.info().engine,
                admission.ticket.clone(),
            )
            .await;
        if let Err(e) = recorded {
            let _ = handle.destroy().await;
            return Err(e);
        }
        // The record took the ticket over.
        admission.ticket = None;
        Ok(handle)
    }
}
