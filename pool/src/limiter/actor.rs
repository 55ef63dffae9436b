//! The [`Limiter`] actor around a [`LimiterCore`].

use actix::{Actor, Context, Handler, Message, MessageResult};
use paddock_core::Error;

use super::{LimiterCore, LimiterStats, Permit};

/// The limiter as an actor. Admissions are answered in mailbox order; permits are
/// released without a message (see [`Permit`]).
///
/// Send [`Admit`] with `send` or `try_send` (never `do_send`, which ignores the
/// mailbox's bound). If the caller goes away before the answer arrives, the permit
/// is dropped with the answer and its slot is released.
///
/// ```
/// use paddock_pool::clock::SystemClock;
/// use paddock_pool::limiter::{Admit, Limiter, LimiterConfig, LimiterCore};
/// use actix::Actor;
///
/// actix::System::new().block_on(async {
///     let core = LimiterCore::new(LimiterConfig::default(), SystemClock::shared()).unwrap();
///     let limiter = Limiter::new(core).start();
///     let permit = limiter.send(Admit::tenant("acme")).await.unwrap();
///     assert!(permit.is_ok());
/// });
/// ```
#[derive(Debug)]
pub struct Limiter {
    core: LimiterCore,
}

impl Limiter {
    /// An actor owning `core`.
    pub fn new(core: LimiterCore) -> Limiter {
        Limiter { core }
    }
}

impl Actor for Limiter {
    type Context = Context<Self>;
}

/// Asks for a [`Permit`] for one execution of `tenant` (`None`: the anonymous tenant).
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "Result<Permit, Error>")]
pub struct Admit {
    /// The tenant the execution is accounted to.
    pub tenant: Option<String>,
}

impl Admit {
    /// An admission request for a named tenant.
    pub fn tenant(name: impl Into<String>) -> Admit {
        Admit {
            tenant: Some(name.into()),
        }
    }
}

impl Handler<Admit> for Limiter {
    type Result = Result<Permit, Error>;

    fn handle(&mut self, msg: Admit, _ctx: &mut Context<Self>) -> Self::Result {
        self.core.try_admit(msg.tenant.as_deref())
    }
}

/// Asks for the limiter's [`LimiterStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "LimiterStats")]
pub struct Stats;

impl Handler<Stats> for Limiter {
    type Result = MessageResult<Stats>;

    fn handle(&mut self, _msg: Stats, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.stats())
    }
}
