//! TCP streams into the guest: where they may go ([`TcpTarget`], its loopback only) and
//! the connection an engine hands back.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where a TCP stream into the guest goes: a port on the guest's own loopback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpTarget {
    /// The port (1..=65535).
    pub port: u16,
    /// `127.0.0.1` (default), any `127.x.y.z`, `::1` or `localhost`.
    #[serde(default = "default_host")]
    pub host: String,
}

fn default_host() -> String {
    "127.0.0.1".into()
}

impl TcpTarget {
    /// Port `port` on the guest's `127.0.0.1`.
    pub fn loopback(port: u16) -> TcpTarget {
        TcpTarget {
            port,
            host: default_host(),
        }
    }

    /// The address to connect to inside the guest. Anything but a loopback address
    /// (or `localhost`) is refused with `INVALID_OPTIONS`: the stream reaches
    /// services in the sandbox, never another machine, and names are not resolved.
    pub fn loopback_addr(&self) -> Result<SocketAddr> {
        if self.port == 0 {
            return Err(Error::invalid_options(
                "port",
                "0 is no port; name the port the service listens on",
            ));
        }
        let ip: IpAddr = if self.host.eq_ignore_ascii_case("localhost") {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            let bare = self.host.trim_start_matches('[').trim_end_matches(']');
            bare.parse().map_err(|_| refused(&self.host))?
        };
        if !ip.is_loopback() {
            return Err(refused(&self.host));
        }
        Ok(SocketAddr::new(ip, self.port))
    }
}

fn refused(host: &str) -> Error {
    Error::invalid_options(
        "host",
        format!(
            "{host:?} is not the guest's loopback: a TCP stream reaches services inside the sandbox only; use 127.0.0.1, ::1 or localhost"
        ),
    )
}

/// A two-way byte stream to a service listening inside a sandbox.
// tokio's networking is configured out under the loom models' `--cfg loom`.
#[cfg(not(loom))]
#[derive(Debug)]
pub struct TcpConnection {
    /// The connected stream (registered with the current tokio runtime).
    pub stream: tokio::net::TcpStream,
    /// The guest address it reached.
    pub target: SocketAddr,
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorCode;

    use super::*;

    #[test]
    fn only_loopback_hosts_are_accepted() {
        for host in [
            "127.0.0.1",
            "127.3.2.1",
            "::1",
            "[::1]",
            "localhost",
            "LOCALHOST",
        ] {
            let t = TcpTarget {
                port: 80,
                host: host.into(),
            };
            let addr = t.loopback_addr().unwrap_or_else(|e| panic!("{host}: {e}"));
            assert!(addr.ip().is_loopback());
            assert_eq!(addr.port(), 80);
        }
        for host in [
            "10.0.0.1",
            "0.0.0.0",
            "192.168.1.1",
            "::",
            "example.com",
            "localhost.example.com",
            "",
            "::ffff:127.0.0.1",
        ] {
            let t = TcpTarget {
                port: 80,
                host: host.into(),
            };
            let e = t.loopback_addr().unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidOptions, "{host}");
            assert!(e.message.contains("loopback"), "{host}: {}", e.message);
        }
        let zero = TcpTarget::loopback(0).loopback_addr().unwrap_err();
        assert_eq!(zero.code, ErrorCode::InvalidOptions);
    }
}
