//! [`ValidRequest`]: the proof that an [`ExecRequest`] passed
//! [`ExecRequest::validate`], so that a request is checked once on its way to an
//! engine instead of at every hop.
//!
//! The scheduler makes the proof when it admits a request and hands it to the
//! engine ([`Sandbox::exec_valid`](crate::Sandbox::exec_valid)), which then skips
//! its own validation; an embedder that calls [`Sandbox::exec`](crate::Sandbox::exec)
//! directly gets the same validation there, by the same function. A proof is never
//! serialized: a request that crossed a wire is checked again where it lands.
//!
//! ```
//! use paddock_core::{ExecRequest, Program, ValidRequest};
//!
//! let request = ExecRequest::new(Program::Command { argv: vec!["true".into()] });
//! let valid = ValidRequest::new(request).unwrap();
//! assert_eq!(valid.program.kind(), paddock_core::ProgramKind::Command);
//!
//! let bad = ExecRequest::new(Program::Command { argv: vec![] });
//! assert!(ValidRequest::new(bad).is_err());
//! ```

use std::ops::Deref;

use crate::error::Result;
use crate::exec::ExecRequest;
use crate::limits::Limits;

/// An [`ExecRequest`] that passed [`ExecRequest::validate`]. Only
/// [`ValidRequest::new`] makes one, and it gives no mutable access to the request,
/// so a proof cannot outlive a change that would invalidate it.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest(ExecRequest);

impl ValidRequest {
    /// Validates `request` with [`ExecRequest::validate`]: the proof, or the
    /// `INVALID_OPTIONS` error naming what was wrong.
    pub fn new(request: ExecRequest) -> Result<ValidRequest> {
        request.validate()?;
        Ok(ValidRequest(request))
    }

    /// The request.
    pub fn request(&self) -> &ExecRequest {
        &self.0
    }

    /// The request, giving up the proof.
    pub fn into_inner(self) -> ExecRequest {
        self.0
    }

    /// The request with each limit it leaves unset taken from `base` (a
    /// sandbox's own limits). Only the merged limits are checked (their ranges,
    /// [`Limits::validate`]), not the whole request again.
    pub fn or_limits(mut self, base: &Limits) -> Result<ValidRequest> {
        let limits = self.0.limits.or(base);
        limits.validate("limits", false)?;
        self.0.limits = limits;
        Ok(self)
    }
}

impl Deref for ValidRequest {
    type Target = ExecRequest;

    fn deref(&self) -> &ExecRequest {
        &self.0
    }
}

impl From<ValidRequest> for ExecRequest {
    fn from(valid: ValidRequest) -> ExecRequest {
        valid.0
    }
}

/// Test probes: counting validations (see [`ValidationProbe`]), built only for
/// tests (the `probes` feature, which the workspace's test builds turn on).
#[cfg(any(test, feature = "probes"))]
mod probe {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;

    use parking_lot::Mutex;

    use crate::exec::{ExecRequest, ExecutionId};

    /// How many probes live; validation looks at the map only when some do.
    static WATCHED: AtomicUsize = AtomicUsize::new(0);

    /// What a probe counts the validations of.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    enum Watched {
        /// Requests with this id.
        Id(ExecutionId),
        /// Requests accounted to this tenant.
        Tenant(String),
    }

    /// The count of validations of each watched id or tenant.
    fn counts() -> &'static Mutex<HashMap<Watched, usize>> {
        static COUNTS: OnceLock<Mutex<HashMap<Watched, usize>>> = OnceLock::new();
        COUNTS.get_or_init(Mutex::default)
    }

    /// Counts the runs of [`ExecRequest::validate`] on requests with one id (or of one
    /// tenant), for as long as it lives: how a test shows how many times a path
    /// validates a request. While no probe lives, validation pays one atomic load.
    #[derive(Debug)]
    pub struct ValidationProbe {
        watched: Watched,
    }

    impl ValidationProbe {
        /// Starts counting the validations of requests whose id is `id`.
        pub fn watch(id: &ExecutionId) -> ValidationProbe {
            ValidationProbe::start(Watched::Id(id.clone()))
        }

        /// Starts counting the validations of requests accounted to `tenant` (for a
        /// path that gives the request its id on the way, such as the HTTP API's).
        pub fn watch_tenant(tenant: &str) -> ValidationProbe {
            ValidationProbe::start(Watched::Tenant(tenant.to_string()))
        }

        fn start(watched: Watched) -> ValidationProbe {
            if counts().lock().insert(watched.clone(), 0).is_none() {
                WATCHED.fetch_add(1, Ordering::AcqRel);
            }
            ValidationProbe { watched }
        }

        /// How many times a watched request was validated so far.
        pub fn count(&self) -> usize {
            counts().lock().get(&self.watched).copied().unwrap_or(0)
        }
    }

    impl Drop for ValidationProbe {
        fn drop(&mut self) {
            if counts().lock().remove(&self.watched).is_some() {
                WATCHED.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Notes one validation of `request` (called by [`ExecRequest::validate`]).
    pub(crate) fn note(request: &ExecRequest) {
        if WATCHED.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut counts = counts().lock();
        if let Some(n) = counts.get_mut(&Watched::Id(request.id.clone())) {
            *n += 1;
        }
        if let Some(tenant) = &request.tenant {
            if let Some(n) = counts.get_mut(&Watched::Tenant(tenant.clone())) {
                *n += 1;
            }
        }
    }
}

#[cfg(any(test, feature = "probes"))]
pub use probe::ValidationProbe;

/// Notes one validation of `request`: nothing without the `probes` feature.
#[cfg(not(any(test, feature = "probes")))]
pub(crate) fn note(_request: &ExecRequest) {}

#[cfg(any(test, feature = "probes"))]
pub(crate) use probe::note;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::Program;

    fn request() -> ExecRequest {
        ExecRequest::new(Program::Command {
            argv: vec!["true".into()],
        })
    }

    #[test]
    fn the_proof_is_made_by_validation_alone() {
        let r = request();
        let probe = ValidationProbe::watch(&r.id);
        let valid = ValidRequest::new(r.clone()).unwrap();
        assert_eq!(probe.count(), 1);
        assert_eq!(valid.request(), &r);
        // Reading it, or giving it to someone, does not validate again.
        let back: ExecRequest = valid.clone().into();
        assert_eq!(back, r);
        assert_eq!(probe.count(), 1);
        let mut bad = request();
        bad.env.insert("A=B".into(), "x".into());
        let e = ValidRequest::new(bad).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidOptions);
    }

    #[test]
    fn merged_limits_are_checked() {
        let valid = ValidRequest::new(request().with_timeout_ms(5)).unwrap();
        let base = Limits {
            pids: Some(7),
            timeout_ms: Some(9),
            ..Limits::default()
        };
        let merged = valid.clone().or_limits(&base).unwrap();
        assert_eq!(
            (merged.limits.timeout_ms, merged.limits.pids),
            (Some(5), Some(7))
        );
        let out_of_range = Limits {
            pids: Some(0),
            ..Limits::default()
        };
        assert!(valid.or_limits(&out_of_range).is_err());
    }

    #[test]
    fn a_probe_counts_only_its_id_and_only_while_it_lives() {
        let (a, b) = (request(), request());
        let probe = ValidationProbe::watch(&a.id);
        a.validate().unwrap();
        b.validate().unwrap();
        a.validate().unwrap();
        assert_eq!(probe.count(), 2);
        let id = a.id.clone();
        drop(probe);
        a.validate().unwrap();
        assert_eq!(ValidationProbe::watch(&id).count(), 0);
        let tenant = format!("t-{}", a.id);
        let probe = ValidationProbe::watch_tenant(&tenant);
        let mut c = request();
        c.tenant = Some(tenant);
        c.validate().unwrap();
        a.validate().unwrap();
        assert_eq!(probe.count(), 1);
    }
}
