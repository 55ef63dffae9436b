//! [`OperatorAccess`]: the record of an operator key reaching beyond its own tenant.

use serde::{Deserialize, Serialize};

use super::entry::Timestamp;

/// Most operator accesses kept in memory (the file, when configured, keeps all).
pub const MAX_ACCESS_RECORDS: usize = 10_000;

/// One use of an operator key: who, when, and what it asked for.
///
/// Written to the audit file as a line with `"kind": "operator_access"`, beside the
/// execution entries, and kept in a bounded ring ([`MAX_ACCESS_RECORDS`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OperatorAccess {
    /// When.
    pub timestamp: Timestamp,
    /// The operator (the tenant named on its key).
    pub operator: String,
    /// What it did, for example `audit.search`, `stats`, `execution.get`,
    /// `execution.cancel`.
    pub action: String,
    /// The object it named, if any (an execution id, a tenant filter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl OperatorAccess {
    /// A record of `operator` doing `action` (on `target`) now.
    pub fn now(operator: &str, action: &str, target: Option<String>) -> OperatorAccess {
        OperatorAccess {
            timestamp: Timestamp::from_unix_ms(paddock_core::unix_ms()),
            operator: operator.to_owned(),
            action: action.to_owned(),
            target,
        }
    }
}
