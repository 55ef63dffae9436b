//! What the scheduler and a fleet share about work run across nodes: what is done
//! with an execution whose node was lost ([`OnNodeLoss`]). The fleet's settings
//! (`[fleet]`) are `paddock-fleet`'s.

use serde::{Deserialize, Serialize};

/// What a fleet does with an execution whose node was lost while it ran: the
/// program may have had effects there that no fence can undo.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnNodeLoss {
    /// Answer `NODE_LOST`, so that the caller decides whether running it again is
    /// safe. The default: an agent's tool call that sent a message or wrote to a
    /// database must not silently happen twice.
    #[default]
    Report,
    /// Run it again on another node (at most `fleet.max_attempts` runs in all), for
    /// programs that are safe to repeat.
    Retry,
}

impl OnNodeLoss {
    /// The wire name: `report` or `retry`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnNodeLoss::Report => "report",
            OnNodeLoss::Retry => "retry",
        }
    }
}
