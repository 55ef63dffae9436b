//! The [`Audit`] actor around an [`AuditLog`].

use std::io;
use std::time::Duration;

use actix::{Actor, ActorContext, AsyncContext, Context, Handler, Message, MessageResult};

use super::access::OperatorAccess;
use super::entry::AuditEntry;
use super::log::{AuditHealth, AuditLog, AuditQuery, AuditStats};

/// The audit log as an actor.
///
/// It flushes the file every `flush_interval_ms` and when it stops; it stops at the
/// first interval after its last address is dropped, or with its system. Record, search
/// and statistics are answered in mailbox order, so a search sent after a record sees
/// it. File writes are buffered; a flush is one `write` to the page cache, short
/// enough for a shared arbiter, but an embedder with a slow disk can give the actor an
/// arbiter of its own (`Audit::start_in_arbiter`).
///
/// Send [`Record`] with `send` or `try_send`, not `do_send`, which ignores the
/// mailbox's bound.
///
/// ```
/// use actix::Actor;
/// use paddock_pool::audit::{Audit, AuditConfig, AuditLog, Statistics};
///
/// actix::System::new().block_on(async {
///     let audit = Audit::new(AuditLog::new(AuditConfig::default()).unwrap()).start();
///     let stats = audit.send(Statistics).await.unwrap();
///     assert_eq!(stats.total, 0);
/// });
/// ```
#[derive(Debug)]
pub struct Audit {
    log: AuditLog,
}

impl Audit {
    /// An actor owning `log`.
    pub fn new(log: AuditLog) -> Audit {
        Audit { log }
    }

    fn flush_quietly(&mut self) {
        // A failure is recorded in the log's health; there is no caller to tell.
        let _ = self.log.flush();
    }
}

impl Actor for Audit {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let every = Duration::from_millis(self.log.config().flush_interval_ms);
        ctx.run_interval(every, |audit, ctx| {
            audit.flush_quietly();
            // The interval keeps the context alive, so stop by hand once no address
            // is left (stopping flushes).
            if !ctx.connected() {
                ctx.stop();
            }
        });
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.flush_quietly();
    }
}

/// Records one entry. Answers `false` when an entry with the same id is still in
/// the ring (nothing is recorded).
#[derive(Debug, Clone, Message)]
#[rtype(result = "bool")]
pub struct Record(pub AuditEntry);

impl Handler<Record> for Audit {
    type Result = bool;

    fn handle(&mut self, msg: Record, _ctx: &mut Context<Self>) -> bool {
        self.log.record(msg.0)
    }
}

/// Searches the ring; see [`AuditLog::search`].
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<AuditEntry>")]
pub struct Search(pub AuditQuery);

impl Handler<Search> for Audit {
    type Result = MessageResult<Search>;

    fn handle(&mut self, msg: Search, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.log.search(&msg.0))
    }
}

/// Searches the ring for one tenant's entries (`owner`: `Some(None)` is entries
/// without a tenant; `None` every tenant, as [`Search`]).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<AuditEntry>")]
pub struct SearchFor {
    /// The filters.
    pub query: AuditQuery,
    /// Whose entries.
    pub owner: Option<Option<String>>,
}

impl Handler<SearchFor> for Audit {
    type Result = MessageResult<SearchFor>;

    fn handle(&mut self, msg: SearchFor, _ctx: &mut Context<Self>) -> Self::Result {
        let owner = msg.owner.as_ref().map(|o| o.as_deref());
        MessageResult(self.log.search_for(&msg.query, owner))
    }
}

/// Asks for one tenant's [`AuditStats`], over its entries still in the ring
/// (`owner` as in [`SearchFor`]; `None` is [`Statistics`]).
#[derive(Debug, Clone, Message)]
#[rtype(result = "AuditStats")]
pub struct StatisticsFor {
    /// Whose figures.
    pub owner: Option<Option<String>>,
}

impl Handler<StatisticsFor> for Audit {
    type Result = MessageResult<StatisticsFor>;

    fn handle(&mut self, msg: StatisticsFor, _ctx: &mut Context<Self>) -> Self::Result {
        let owner = msg.owner.as_ref().map(|o| o.as_deref());
        MessageResult(self.log.statistics_for(owner))
    }
}

/// Records an operator's access.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct RecordAccess(pub OperatorAccess);

impl Handler<RecordAccess> for Audit {
    type Result = ();

    fn handle(&mut self, msg: RecordAccess, _ctx: &mut Context<Self>) {
        self.log.record_access(msg.0);
    }
}

/// The most recent operator accesses, newest first, at most `limit`.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<OperatorAccess>")]
pub struct Accesses {
    /// At most this many.
    pub limit: usize,
}

impl Handler<Accesses> for Audit {
    type Result = MessageResult<Accesses>;

    fn handle(&mut self, msg: Accesses, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.log.accesses(msg.limit))
    }
}

/// Asks for [`AuditStats`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "AuditStats")]
pub struct Statistics;

impl Handler<Statistics> for Audit {
    type Result = MessageResult<Statistics>;

    fn handle(&mut self, _msg: Statistics, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.log.statistics())
    }
}

/// Asks for [`AuditHealth`].
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "AuditHealth")]
pub struct Health;

impl Handler<Health> for Audit {
    type Result = MessageResult<Health>;

    fn handle(&mut self, _msg: Health, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.log.health())
    }
}

/// Writes buffered lines to the file now.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "io::Result<()>")]
pub struct Flush;

impl Handler<Flush> for Audit {
    type Result = io::Result<()>;

    fn handle(&mut self, _msg: Flush, _ctx: &mut Context<Self>) -> io::Result<()> {
        self.log.flush()
    }
}
