//! Settings of a fleet: many Paddock nodes acting as one through NATS JetStream
//! (`[fleet]`, or `paddock serve --fleet`). Without URLs a node is on its own, as
//! the embedded default is.

use serde::{Deserialize, Serialize};

use paddock_core::{Error, OnNodeLoss, Result};

/// `[fleet]`: the NATS servers to join, and how this node takes part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// The NATS servers (`nats://HOST:PORT`); empty: not in a fleet. Default empty.
    pub urls: Vec<String>,
    /// Whether the node also uses the servers the cluster tells it of, beyond
    /// `urls`, when it reconnects. Default `true`.
    pub discover_servers: bool,
    /// This node's id: letters, digits, `-` and `_`, at most 64. Default: the host's
    /// name and the process id.
    pub node_id: Option<String>,
    /// The prefix of every subject, stream and bucket the fleet uses, so that
    /// several fleets can share one NATS cluster. Default `paddock`.
    pub prefix: String,
    /// The base URL other nodes and clients reach this node's HTTP API at. Default:
    /// `http://` and the address the server bound.
    pub advertise: Option<String>,
    /// Replicas of the fleet's streams and buckets: 0 chooses 3 when the cluster has
    /// three servers or more, else 1. Default 0.
    pub replicas: usize,
    /// How often a node publishes its capacity, and renews the leases of the work it
    /// runs. Default 1000 ms.
    pub heartbeat_ms: u64,
    /// How long work stays with a node that stopped renewing it before another node
    /// may take it (the work queue's ack wait, and the lease's length). A node that
    /// cannot renew stops its run a heartbeat before the lease ends, so this must
    /// be well above the cluster's leader elections (4–6 s without a write, measured
    /// on a three-server cluster), or an election makes every node give up its runs.
    /// Default 10000 ms.
    pub ack_wait_ms: u64,
    /// Whether this node runs the fleet's work; `false` makes it a gateway that
    /// only accepts work for the others. Default `true`.
    pub take_work: bool,
    /// What to do with work whose node was lost while it ran. Default `report`.
    pub on_node_loss: OnNodeLoss,
    /// Most runs of one execution when `on_node_loss = "retry"`. Default 3.
    pub max_attempts: u32,
    /// Work no node has started this long after it was accepted is answered
    /// `timed_out`, without running. Default 60000 ms.
    pub queue_timeout_ms: u64,
    /// Most executions waiting in one engine's work queue; beyond it
    /// `POOL_EXHAUSTED`. Default 100000.
    pub max_queued: u64,
    /// How long the fleet keeps results, idempotency keys and audit entries.
    /// Default 3600 s.
    pub retention_s: u64,
    /// Most bytes of each engine's work queue, and of the audit stream (the oldest
    /// entries go first). The NATS servers reserve it: their JetStream
    /// `max_file_store` must hold every stream's. Default 256 MiB.
    pub max_stream_bytes: u64,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            urls: Vec::new(),
            discover_servers: true,
            node_id: None,
            prefix: "paddock".into(),
            advertise: None,
            replicas: 0,
            heartbeat_ms: 1_000,
            ack_wait_ms: 10_000,
            take_work: true,
            on_node_loss: OnNodeLoss::Report,
            max_attempts: 3,
            queue_timeout_ms: 60_000,
            max_queued: 100_000,
            retention_s: 3_600,
            max_stream_bytes: 256 << 20,
        }
    }
}

/// Whether `s` is a usable id or prefix: 1 to 64 of letters, digits, `-` and `_`
/// (what NATS accepts in a subject token and a stream name alike).
pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl FleetConfig {
    /// Whether the node joins a fleet.
    pub fn enabled(&self) -> bool {
        !self.urls.is_empty()
    }

    /// Checks the values; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        for url in &self.urls {
            let rest = url
                .strip_prefix("nats://")
                .or_else(|| url.strip_prefix("tls://"));
            let ok = rest.is_some_and(|r| {
                let host_port = r.rsplit('@').next().unwrap_or(r);
                host_port
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            });
            if !ok {
                return Err(Error::invalid_config(
                    "fleet.urls",
                    format!("`{url}` is not a NATS URL; write nats://HOST:PORT"),
                ));
            }
        }
        if let Some(id) = &self.node_id {
            if !is_token(id) {
                return Err(Error::invalid_config(
                    "fleet.node_id",
                    format!("`{id}` must be 1 to 64 letters, digits, `-` or `_`"),
                ));
            }
        }
        if !is_token(&self.prefix) || self.prefix.len() > 32 {
            return Err(Error::invalid_config(
                "fleet.prefix",
                "must be 1 to 32 letters, digits, `-` or `_`",
            ));
        }
        if let Some(a) = &self.advertise {
            if !(a.starts_with("http://") || a.starts_with("https://")) || a.len() > 512 {
                return Err(Error::invalid_config(
                    "fleet.advertise",
                    format!("`{a}` must be an http:// or https:// base URL"),
                ));
            }
        }
        if self.replicas > 5 {
            return Err(Error::invalid_config(
                "fleet.replicas",
                "must be 0 (chosen from the cluster) or 1..=5",
            ));
        }
        let ranges: [(&str, u64, u64, u64); 7] = [
            ("fleet.heartbeat_ms", self.heartbeat_ms, 50, 60_000),
            ("fleet.ack_wait_ms", self.ack_wait_ms, 200, 600_000),
            ("fleet.max_attempts", u64::from(self.max_attempts), 1, 100),
            (
                "fleet.queue_timeout_ms",
                self.queue_timeout_ms,
                1,
                86_400_000,
            ),
            ("fleet.max_queued", self.max_queued, 1, 100_000_000),
            ("fleet.retention_s", self.retention_s, 10, 30 * 86_400),
            (
                "fleet.max_stream_bytes",
                self.max_stream_bytes,
                1 << 20,
                1 << 40,
            ),
        ];
        for (field, value, min, max) in ranges {
            if value < min || value > max {
                return Err(Error::invalid_config(
                    field,
                    format!("{value} is out of range {min}..={max}"),
                ));
            }
        }
        if self.ack_wait_ms < 2 * self.heartbeat_ms {
            return Err(Error::invalid_config(
                "fleet.ack_wait_ms",
                format!(
                    "{} must be at least twice fleet.heartbeat_ms ({}), or work is taken from nodes that are alive",
                    self.ack_wait_ms, self.heartbeat_ms
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_off() {
        let c = FleetConfig::default();
        c.validate().unwrap();
        assert!(!c.enabled());
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases: Vec<(FleetConfig, &str)> = vec![
            (
                FleetConfig {
                    urls: vec!["http://x:1".into()],
                    ..Default::default()
                },
                "fleet.urls",
            ),
            (
                FleetConfig {
                    urls: vec!["nats://host".into()],
                    ..Default::default()
                },
                "fleet.urls",
            ),
            (
                FleetConfig {
                    node_id: Some("a.b".into()),
                    ..Default::default()
                },
                "fleet.node_id",
            ),
            (
                FleetConfig {
                    prefix: "".into(),
                    ..Default::default()
                },
                "fleet.prefix",
            ),
            (
                FleetConfig {
                    advertise: Some("ftp://x".into()),
                    ..Default::default()
                },
                "fleet.advertise",
            ),
            (
                FleetConfig {
                    replicas: 7,
                    ..Default::default()
                },
                "fleet.replicas",
            ),
            (
                FleetConfig {
                    heartbeat_ms: 1_000,
                    ack_wait_ms: 1_500,
                    ..Default::default()
                },
                "fleet.ack_wait_ms",
            ),
            (
                FleetConfig {
                    max_attempts: 0,
                    ..Default::default()
                },
                "fleet.max_attempts",
            ),
        ];
        for (c, field) in cases {
            let e = c.validate().unwrap_err();
            assert!(e.message.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn good_urls_pass() {
        let c = FleetConfig {
            urls: vec![
                "nats://127.0.0.1:4222".into(),
                "nats://user:pw@[::1]:4223".into(),
                "tls://nats.example:4222".into(),
            ],
            node_id: Some("node-1".into()),
            ..Default::default()
        };
        c.validate().unwrap();
        assert!(c.enabled());
    }
}
