//! `paddock serve`: the HTTP API on embedded defaults or a config file.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use paddock::PaddockConfig;

use crate::run::UsageError;

/// Arguments of `paddock serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (default from the config: 127.0.0.1:7878; port 0 picks a
    /// free port).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<String>,
    /// A configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Join a fleet through these NATS servers (comma-separated
    /// `nats://HOST:PORT`; overrides `fleet.urls`). Without it the server runs on
    /// its own.
    #[arg(long, value_name = "nats://HOST:PORT[,...]", value_delimiter = ',')]
    fleet: Vec<String>,
    /// This node's id in the fleet (overrides `fleet.node_id`; default: the host's
    /// name and the process id).
    #[arg(long, value_name = "ID")]
    node_id: Option<String>,
    /// Serve the E2B-compatible API on the same listener (as `e2b.enabled`): point
    /// E2B_API_URL and E2B_SANDBOX_URL at the printed URL.
    #[arg(long)]
    e2b: bool,
}

/// Loads a config file (or the embedded defaults), then applies the environment:
/// `PADDOCK_LISTEN` overrides `server.listen`; `PADDOCK_API_KEYS`
/// (`tenant=key,tenant2=key2`) adds API keys.
pub(crate) fn load_config(path: Option<&PathBuf>) -> Result<PaddockConfig, UsageError> {
    let mut config = load_file(path)?;
    if let Ok(listen) = std::env::var("PADDOCK_LISTEN") {
        config.server.listen = listen;
    }
    if let Ok(keys) = std::env::var("PADDOCK_API_KEYS") {
        for pair in keys.split(',').filter(|p| !p.trim().is_empty()) {
            let Some((tenant, key)) = pair.split_once('=') else {
                return Err(UsageError(
                    "PADDOCK_API_KEYS must look like tenant=key,tenant2=key2".into(),
                ));
            };
            config
                .server
                .api_keys
                .push(paddock_pool::http::ApiKey::new(key.trim(), tenant.trim()));
        }
    }
    config.validate().map_err(|e| UsageError(e.to_string()))?;
    Ok(config)
}

fn load_file(path: Option<&PathBuf>) -> Result<PaddockConfig, UsageError> {
    match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| UsageError(format!("reading `{}`: {e}", path.display())))?;
            PaddockConfig::from_toml_str(&text)
                .map_err(|e| UsageError(format!("{}: {e}", path.display())))
        }
        None => Ok(PaddockConfig::default()),
    }
}

/// Runs the server until SIGINT or SIGTERM, then shuts down gracefully.
pub(crate) async fn serve(args: ServeArgs) -> Result<i32, UsageError> {
    // Warnings (and what `RUST_LOG` asks for) go to stderr.
    let _tracing = {
        use std::io::IsTerminal;
        paddock_telemetry::init_tracing(
            paddock_telemetry::TracingConfig::new("warn")
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .map_err(|e| UsageError(format!("setting up logging: {e}")))?
    };
    let mut config = load_config(args.config.as_ref())?;
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if !args.fleet.is_empty() {
        config.fleet.urls = args.fleet.iter().map(|u| u.trim().to_string()).collect();
    }
    if let Some(id) = args.node_id {
        config.fleet.node_id = Some(id);
    }
    if args.e2b {
        config.e2b.enabled = true;
    }
    config.validate().map_err(|e| UsageError(e.to_string()))?;
    let server_config = config.server.clone();
    let fleet_advertise = config.fleet.advertise.clone();
    let e2b_domain = config.e2b.domain.clone();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| UsageError(format!("installing the SIGTERM handler: {e}")))?;
    let node = match paddock::node::Node::start(config).await {
        Ok(node) => node,
        Err(e) => {
            eprintln!("paddock serve: {e}");
            return Ok(1);
        }
    };
    // An enabled engine that cannot run here is said once, with its fix; requests
    // and templates that need it are refused, never run on a weaker engine.
    for (engine, why) in node.paddock().unavailable_engines() {
        eprintln!(
            "paddock serve: warning: the {engine} engine is not available: {why}; requests and templates that need it are refused (run `paddock doctor`; server.require_engines = true refuses to start instead)"
        );
    }
    let server = node.server();
    if let Some(f) = node.fleet() {
        if server.local_addr().ip().is_unspecified() && fleet_advertise.is_none() {
            eprintln!(
                "paddock serve: warning: listening on {} with no fleet.advertise: the other \
                 nodes cannot reach this one's sandboxes; set fleet.advertise to an address \
                 they can reach",
                server.local_addr()
            );
        }
        eprintln!("paddock serve: node {} joined the fleet", f.node_id());
    }
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "http://{}", server.local_addr());
        // The TLS listener's URL on a second line, when there is one.
        if let Some(at) = server.tls_addr() {
            let _ = writeln!(out, "https://{at}");
        }
        let _ = out.flush();
    }
    eprintln!("paddock serve: listening on http://{}", server.local_addr());
    if let Some(at) = server.tls_addr() {
        eprintln!("paddock serve: and with TLS on https://{at}");
    }
    if node.e2b().is_some() {
        eprintln!(
            "paddock serve: the E2B API is on http://{0} (E2B_API_URL=http://{0} E2B_SANDBOX_URL=http://{0})",
            server.local_addr()
        );
        if let (Some(at), Some(domain)) = (server.tls_addr(), &e2b_domain) {
            eprintln!(
                "paddock serve: and for E2B_DOMAIN={domain} on https://{at}: api.{domain} and *.{domain} must resolve to this host, on port 443"
            );
        }
    }
    for at in std::iter::once(server.local_addr()).chain(server.tls_addr()) {
        if let Some(warning) = exposure_warning(&server_config, at) {
            eprintln!("paddock serve: warning: {warning}");
        }
    }
    if let Some(warning) = descriptor_warning(&server_config, open_files_limit()) {
        eprintln!("paddock serve: warning: {warning}");
    }
    if let Some(at) = server.metrics_addr() {
        eprintln!("paddock serve: /metrics on http://{at}");
    }

    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let drain = node.drain();
    eprintln!("paddock serve: draining (up to {} ms)", drain.as_millis());
    let report = node.stop(drain).await;
    match report {
        Ok(r) => {
            eprintln!(
                "paddock serve: stopped; {} drained, {} cancelled, {} sandboxes destroyed",
                r.drained, r.cancelled, r.sandboxes_destroyed
            );
            Ok(0)
        }
        Err(e) => {
            eprintln!("paddock serve: shutdown failed: {e}");
            Ok(1)
        }
    }
}

/// What to warn about when the server listens beyond loopback without API keys:
/// anyone who reaches the address then runs code as any tenant they claim.
fn exposure_warning(
    config: &paddock_pool::http::ServerConfig,
    addr: std::net::SocketAddr,
) -> Option<String> {
    if !config.api_keys.is_empty() || addr.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "listening on {addr}, beyond loopback, without API keys: anyone who can reach it runs code and \
         claims any tenant with X-Paddock-Tenant; set [[server.api_keys]] or PADDOCK_API_KEYS \
         (docs/security.md)"
    ))
}

/// This process's open-files limit (soft), from `/proc/self/limits`.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// What to warn about when the connections the server lets clients without a key
/// hold (two descriptors each: the socket and the server's copy of it) would take
/// more than half of the process's open-files `limit`: the cap would then not keep
/// descriptors for authenticated work.
fn descriptor_warning(
    config: &paddock_pool::http::ServerConfig,
    limit: Option<u64>,
) -> Option<String> {
    let limit = limit?;
    let held = u64::from(config.max_unauthenticated_connections) * 2;
    (held > limit / 2).then(|| {
        format!(
            "server.max_unauthenticated_connections = {} lets clients without a key hold {held} of \
             this process's {limit} open files: lower it, or raise the open-files limit (ulimit -n)",
            config.max_unauthenticated_connections
        )
    })
}

/// Arguments of `paddock config`.
#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ConfigCommand {
    /// Validate a configuration file; `INVALID_CONFIG` names the bad field.
    Check {
        /// The TOML file.
        file: PathBuf,
    },
    /// Print the embedded defaults as TOML.
    Defaults,
}

/// Runs `paddock config`.
pub(crate) async fn config(args: ConfigArgs) -> Result<i32, UsageError> {
    match args.command {
        ConfigCommand::Check { file } => match load_file(Some(&file)) {
            // The policy's regexes are compiled only by the policy itself.
            Ok(config) => match paddock_pool::policy::Policy::new(config.policy) {
                Ok(_) => {
                    println!("{}: ok", file.display());
                    Ok(0)
                }
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    Ok(1)
                }
            },
            Err(UsageError(msg)) => {
                eprintln!("{msg}");
                Ok(1)
            }
        },
        ConfigCommand::Defaults => {
            match toml::to_string(&PaddockConfig::default()) {
                Ok(text) => print!("{text}"),
                Err(e) => {
                    eprintln!("paddock config defaults: {e}");
                    return Ok(1);
                }
            }
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::exposure_warning;
    use paddock_pool::http::{ApiKey, ServerConfig};

    #[test]
    fn warns_beyond_loopback_without_keys_only() {
        let open = ServerConfig::default();
        assert!(exposure_warning(&open, "127.0.0.1:7878".parse().unwrap()).is_none());
        assert!(exposure_warning(&open, "[::1]:7878".parse().unwrap()).is_none());
        let w = exposure_warning(&open, "0.0.0.0:7878".parse().unwrap()).unwrap();
        assert!(w.contains("without API keys"), "{w}");
        let mut keyed = ServerConfig::default();
        keyed
            .api_keys
            .push(ApiKey::new("0123456789abcdef", "alice"));
        assert!(exposure_warning(&keyed, "0.0.0.0:7878".parse().unwrap()).is_none());
    }

    #[test]
    fn warns_when_unauthenticated_connections_could_take_half_the_descriptors() {
        let config = ServerConfig::default();
        // 4096 connections, two descriptors each.
        let w = super::descriptor_warning(&config, Some(1024)).unwrap();
        assert!(
            w.contains("server.max_unauthenticated_connections = 4096"),
            "{w}"
        );
        assert!(super::descriptor_warning(&config, Some(20_000)).is_none());
        assert!(super::descriptor_warning(&config, None).is_none());
        assert!(super::open_files_limit().is_some_and(|n| n > 0));
    }
}
