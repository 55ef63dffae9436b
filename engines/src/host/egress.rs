//! The egress gateways of `allowlist` sandboxes, as the engines make them: the
//! host's defaults, `[egress]`'s settings, and one trial, so that an engine offers
//! allowlists only where a gateway can be made.

use std::time::Duration;

use paddock_core::Result;
use paddock_egress::GatewayConfig;

use crate::EgressConfig;

/// The gateway settings for `config`, tried once: `Ok(Err(why))` when allowlists
/// cannot be enforced on this host (no `nft`, no network namespaces, rules that do
/// not load), `Err` when `config` itself is invalid.
pub(crate) fn gateway_config(
    config: &EgressConfig,
) -> Result<std::result::Result<GatewayConfig, String>> {
    config.validate()?;
    let resolvers = config.resolver_addrs()?;
    let mut cfg = match GatewayConfig::detect() {
        Ok(c) => c,
        Err(why) => return Ok(Err(why)),
    };
    if !resolvers.is_empty() {
        cfg.resolvers = resolvers;
    }
    cfg.resolve_timeout = Duration::from_millis(config.resolve_timeout_ms);
    cfg.limits.max_connections = config.max_connections as usize;
    cfg.limits.connect_timeout = Duration::from_millis(config.connect_timeout_ms);
    cfg.allow_private = config.allow_private.unwrap_or(true);
    Ok(cfg.probe().map(|()| cfg))
}
