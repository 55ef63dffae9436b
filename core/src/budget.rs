//! Per-tenant byte budgets: how much memory one tenant's running work may make the
//! host hold at once, for one purpose (input waiting for processes that do not read
//! it, output kept for executions that still run).
//!
//! A [`TenantBudgets`] hands out one [`TenantBudget`] per tenant (every tenant its
//! own, the same for every caller of that tenant); work takes bytes from it and gives
//! them back when it lets go of the memory. Taking never blocks here: an
//! [`OutputAllowance`] is granted what is left and truncates the rest, input takes
//! all of a chunk or is refused (see [`crate::interactive`]).
//!
//! ```
//! use paddock_core::budget::{OutputAllowance, TenantBudgets};
//!
//! let budgets = TenantBudgets::new(100);
//! let first = OutputAllowance::new(budgets.for_tenant(Some("alice")));
//! assert_eq!(first.take(60), 60);
//! let second = OutputAllowance::new(budgets.for_tenant(Some("alice")));
//! assert_eq!(second.take(60), 40, "alice has 40 bytes left");
//! assert!(second.cut());
//! let bob = OutputAllowance::new(budgets.for_tenant(Some("bob")));
//! assert_eq!(bob.take(60), 60, "another tenant's budget is its own");
//! drop(first);
//! assert_eq!(second.take(10), 10, "bytes come back when an execution ends");
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Semaphore;

/// The most bytes one budget may hold (tokio's semaphores count at most
/// `usize::MAX >> 3` permits).
pub const MAX_BUDGET_BYTES: u64 = 1 << 50;

/// One budget per tenant, each of the same size. Tenants with nothing held are
/// forgotten as others come, so the table holds about as many tenants as hold bytes.
#[derive(Debug)]
pub struct TenantBudgets {
    per_tenant: u64,
    table: parking_lot::Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    tenants: HashMap<Option<String>, Arc<Semaphore>>,
    /// The table's size after its last sweep: the next sweep comes at twice that.
    swept_at: usize,
}

impl TenantBudgets {
    /// Budgets of `per_tenant` bytes each (at most [`MAX_BUDGET_BYTES`]).
    pub fn new(per_tenant: u64) -> TenantBudgets {
        TenantBudgets {
            per_tenant: per_tenant.min(MAX_BUDGET_BYTES),
            table: parking_lot::Mutex::default(),
        }
    }

    /// Each tenant's budget, in bytes.
    pub fn per_tenant(&self) -> u64 {
        self.per_tenant
    }

    /// `tenant`'s budget (`None`: the budget of callers without a tenant).
    pub fn for_tenant(&self, tenant: Option<&str>) -> TenantBudget {
        let mut t = self.table.lock();
        let key = tenant.map(str::to_owned);
        if let Some(s) = t.tenants.get(&key) {
            return TenantBudget {
                bytes: s.clone(),
                limit: self.per_tenant,
            };
        }
        if t.tenants.len() >= (2 * t.swept_at).max(64) {
            // Only budgets someone holds (a handle, taken bytes) are kept.
            t.tenants.retain(|_, s| Arc::strong_count(s) > 1);
            t.swept_at = t.tenants.len();
        }
        let s = Arc::new(Semaphore::new(self.per_tenant as usize));
        t.tenants.insert(key, s.clone());
        TenantBudget {
            bytes: s,
            limit: self.per_tenant,
        }
    }
}

/// One tenant's budget; clones share it.
#[derive(Debug, Clone)]
pub struct TenantBudget {
    pub(crate) bytes: Arc<Semaphore>,
    limit: u64,
}

impl TenantBudget {
    /// A budget of its own of `limit` bytes, shared by nobody else (for one process
    /// or one execution, and for tests).
    pub fn alone(limit: u64) -> TenantBudget {
        let limit = limit.min(MAX_BUDGET_BYTES);
        TenantBudget {
            bytes: Arc::new(Semaphore::new(limit as usize)),
            limit,
        }
    }

    /// Its size in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes not taken right now.
    pub fn available(&self) -> u64 {
        self.bytes.available_permits() as u64
    }

    /// Takes up to `want` bytes at once; answers how many were taken (0 when none
    /// are left). The caller gives them back with [`give_back`](Self::give_back).
    fn take_up_to(&self, want: u64) -> u64 {
        loop {
            let left = self.available();
            let n = want.min(left).min(u64::from(u32::MAX));
            if n == 0 {
                return 0;
            }
            if let Ok(p) = self.bytes.try_acquire_many(n as u32) {
                p.forget();
                return n;
            }
        }
    }

    fn give_back(&self, n: u64) {
        if n > 0 {
            self.bytes.add_permits(n as usize);
        }
    }
}

/// One execution's share of its tenant's budget of retained output: what it keeps
/// of its stdout and stderr while it runs. Engines ask it before they keep more
/// bytes ([`OutputSink::allowance`](crate::OutputSink::allowance)) and truncate the
/// output, as at the output cap, when it grants less. Everything taken goes back to
/// the tenant when the allowance is dropped (the execution has ended).
#[derive(Debug)]
pub struct OutputAllowance {
    budget: TenantBudget,
    held: AtomicU64,
    cut: AtomicBool,
}

impl OutputAllowance {
    /// An allowance drawing on `budget`.
    pub fn new(budget: TenantBudget) -> OutputAllowance {
        OutputAllowance {
            budget,
            held: AtomicU64::new(0),
            cut: AtomicBool::new(false),
        }
    }

    /// Takes up to `want` more bytes for this execution; answers how many it may
    /// keep. Less than `want` means the tenant's budget is spent: the rest is cut.
    pub fn take(&self, want: u64) -> u64 {
        let got = self.budget.take_up_to(want);
        self.held.fetch_add(got, Ordering::AcqRel);
        if got < want {
            self.cut.store(true, Ordering::Release);
        }
        got
    }

    /// Whether the budget ever granted less than asked: output was cut by it.
    pub fn cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }

    /// Bytes this execution holds of the budget.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// The tenant's budget in bytes.
    pub fn limit(&self) -> u64 {
        self.budget.limit()
    }
}

impl Drop for OutputAllowance {
    fn drop(&mut self) {
        self.budget.give_back(*self.held.get_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_share_their_own_budget_only() {
        let budgets = TenantBudgets::new(10);
        let a1 = budgets.for_tenant(Some("a"));
        let a2 = budgets.for_tenant(Some("a"));
        assert_eq!(a1.take_up_to(7), 7);
        assert_eq!(a2.available(), 3, "one tenant, one budget");
        assert_eq!(budgets.for_tenant(None).available(), 10);
        assert_eq!(budgets.for_tenant(Some("b")).available(), 10);
        a1.give_back(7);
        assert_eq!(a2.available(), 10);
    }

    #[test]
    fn idle_tenants_are_forgotten() {
        let budgets = TenantBudgets::new(10);
        let held = budgets.for_tenant(Some("keeps"));
        assert_eq!(held.take_up_to(4), 4);
        for i in 0..1000 {
            let _ = budgets.for_tenant(Some(&format!("t{i}")));
        }
        assert!(budgets.table.lock().tenants.len() < 200);
        assert_eq!(
            budgets.for_tenant(Some("keeps")).available(),
            6,
            "a budget someone holds is kept"
        );
    }

    #[test]
    fn an_allowance_gives_back_what_it_took() {
        let budget = TenantBudget::alone(100);
        {
            let a = OutputAllowance::new(budget.clone());
            assert_eq!(a.take(30), 30);
            assert_eq!(a.take(100), 70);
            assert!(a.cut());
            assert_eq!(a.take(1), 0);
            assert_eq!(a.held(), 100);
            assert_eq!(budget.available(), 0);
        }
        assert_eq!(budget.available(), 100);
    }
}
