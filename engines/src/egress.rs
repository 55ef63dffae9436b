//! The egress gateway's settings (`[egress]`).

use paddock_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The egress gateway (`[egress]`): what every sandbox whose network is an
/// allowlist gets, on the engines that enforce allowlists (see `docs/security.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// The resolvers asked for admitted names, as `IP` or `IP:PORT`. Default: none
    /// given, the host's (`/etc/resolv.conf`).
    pub resolvers: Vec<String>,
    /// How long one resolver may take to answer, in milliseconds. Default 3 000.
    pub resolve_timeout_ms: u64,
    /// Connections one sandbox may hold open through the gateway at once; more are
    /// refused (503 from the proxy, a reset on the transparent path). Default 64.
    pub max_connections: u32,
    /// How long a dial of an admitted host may take, in milliseconds. Default 5 000.
    pub connect_timeout_ms: u64,
    /// Whether sandboxes reach private and shared address ranges (`10.0.0.0/8`,
    /// `172.16.0.0/12`, `192.168.0.0/16`, `100.64.0.0/10`, `fc00::/7`): the
    /// operator's own network. When allowed, an allowlist may name them (an API
    /// key's `allow_private` decides for its tenant) and `unrestricted` reaches
    /// them. Default: allowed on a server without API keys, refused with them.
    /// Loopback, link-local (the cloud metadata address), multicast, reserved
    /// ranges and the host's own addresses are never reached, whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_private: Option<bool>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            resolvers: Vec::new(),
            resolve_timeout_ms: 3_000,
            max_connections: 64,
            connect_timeout_ms: 5_000,
            allow_private: None,
        }
    }
}

impl EgressConfig {
    /// The resolvers, parsed (port 53 where none is given).
    pub fn resolver_addrs(&self) -> Result<Vec<std::net::SocketAddr>> {
        self.resolvers
            .iter()
            .enumerate()
            .map(|(i, r)| {
                r.parse::<std::net::SocketAddr>()
                    .or_else(|_| r.parse::<std::net::IpAddr>().map(|ip| (ip, 53).into()))
                    .map_err(|_| {
                        Error::invalid_config(
                            &format!("egress.resolvers[{i}]"),
                            format!("`{r}` is not an IP address or IP:PORT (for example 192.0.2.53 or 192.0.2.53:5353)"),
                        )
                    })
            })
            .collect()
    }

    /// Checks every value; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        if self.resolvers.len() > 8 {
            return Err(Error::invalid_config(
                "egress.resolvers",
                format!("{} resolvers; give at most 8", self.resolvers.len()),
            ));
        }
        self.resolver_addrs()?;
        let ranges: [(&str, u64, u64, u64); 3] = [
            (
                "egress.resolve_timeout_ms",
                self.resolve_timeout_ms,
                100,
                60_000,
            ),
            (
                "egress.max_connections",
                u64::from(self.max_connections),
                1,
                4_096,
            ),
            (
                "egress.connect_timeout_ms",
                self.connect_timeout_ms,
                100,
                60_000,
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
        Ok(())
    }
}
