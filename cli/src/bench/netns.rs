//! A network of the bench's own, on this machine only: a network namespace joined to
//! the host's by a veth pair, with a private address inside it (`10.250.N.2`, or in
//! `172.30.0.0/16` or `192.168.0.0/16` where the host routes all of `10.250.0.0/16`),
//! in a `/24` no route or address of the host's overlaps. The namespace has no route
//! but its `/24`: it answers the host, and reaches nothing else. A scenario that needs a server the host's
//! sandboxes reach as any other host (not one of the host's own addresses, which no
//! gateway dials) binds it there with [`Netns::run_in`]. Dropping it removes the veth
//! and the namespace; a run that died before is swept by the next one.
//!
//! Needs root and iproute2's `ip` ([`unavailable`] says why not).

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The namespaces this module names start so, then the pid of the process that made
/// them.
const PREFIX: &str = "pdkbench-";

/// A namespace with one address, reached from the host through a veth pair.
#[derive(Debug)]
pub(crate) struct Netns {
    name: String,
    veth: String,
    addr: Ipv4Addr,
    fd: File,
}

/// Why a [`Netns`] cannot be made here, if it cannot: not root, or no `ip`.
pub(crate) fn unavailable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("it needs root (a network namespace and a veth pair of its own)".into());
    }
    if which("ip").is_none() {
        return Some("no `ip` program (Debian's package `iproute2`)".into());
    }
    None
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes what an earlier run that died left: namespaces named for a pid that is gone
/// (their veth goes with them).
fn sweep() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(PREFIX) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

/// The IPv4 prefixes the host routes (every table) or holds, but the default route.
fn host_prefixes() -> Result<Vec<(u32, u32)>, String> {
    const TYPES: [&str; 10] = [
        "unicast",
        "local",
        "broadcast",
        "multicast",
        "anycast",
        "unreachable",
        "blackhole",
        "prohibit",
        "throw",
        "nat",
    ];
    let mut prefixes = Vec::new();
    for line in ip(&["-4", "-o", "route", "show", "table", "all"])?.lines() {
        let mut words = line.split_whitespace().skip_while(|w| TYPES.contains(w));
        if let Some(p) = words.next().and_then(parse_prefix) {
            prefixes.push(p);
        }
    }
    for line in ip(&["-4", "-o", "addr", "show"])?.lines() {
        let mut words = line.split_whitespace().skip_while(|w| *w != "inet");
        if let Some(p) = words.nth(1).and_then(parse_prefix) {
            prefixes.push(p);
        }
    }
    Ok(prefixes)
}

/// `a.b.c.d[/len]` as (address, prefix length); `default` is `None`.
fn parse_prefix(s: &str) -> Option<(u32, u32)> {
    let (addr, len) = s.split_once('/').unwrap_or((s, "32"));
    Some((u32::from(addr.parse::<Ipv4Addr>().ok()?), len.parse().ok()?))
}

fn overlaps((a, alen): (u32, u32), (b, blen): (u32, u32)) -> bool {
    let len = alen.min(blen).min(32);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a & mask == b & mask
}

/// A `/24` of a private range that no prefix of `taken` overlaps, starting at a place
/// `seed` picks (so that two runs at once look in different places first).
fn free_subnet(taken: &[(u32, u32)], seed: u32) -> Option<Ipv4Addr> {
    [[10, 250], [172, 30], [192, 168]]
        .iter()
        .flat_map(|[a, b]| {
            (0..256u32).map(move |k| Ipv4Addr::new(*a, *b, ((seed + k) % 256) as u8, 0))
        })
        .find(|net| !taken.iter().any(|&t| overlaps((u32::from(*net), 24), t)))
}

impl Netns {
    /// Makes the namespace, its veth pair and their addresses (the host's end `.1`,
    /// the namespace's `.2`, of one `/24`).
    pub(crate) fn create() -> Result<Netns, String> {
        if let Some(why) = unavailable() {
            return Err(why);
        }
        sweep();
        let pid = std::process::id();
        let name = format!("{PREFIX}{pid}");
        // At most 15 bytes, the peer with a `p` after it.
        let veth = format!("pdkb{}", pid % 100_000);
        let peer = format!("{veth}p");
        let net = free_subnet(&host_prefixes()?, pid)
            .ok_or("every candidate private /24 overlaps a route of the host's")?;
        let [a, b, c, _] = net.octets();
        let (host_side, addr) = (Ipv4Addr::new(a, b, c, 1), Ipv4Addr::new(a, b, c, 2));
        ip(&["netns", "add", &name])?;
        let fd = match File::open(format!("/run/netns/{name}")) {
            Ok(f) => f,
            Err(e) => {
                let _ = ip(&["netns", "del", &name]);
                return Err(format!("opening the namespace {name}: {e}"));
            }
        };
        // From here, dropping it undoes what was done.
        let me = Netns {
            name,
            veth,
            addr,
            fd,
        };
        let ns = me.name.as_str();
        ip(&[
            "link", "add", &me.veth, "type", "veth", "peer", "name", &peer, "netns", ns,
        ])?;
        ip(&["addr", "add", &format!("{host_side}/24"), "dev", &me.veth])?;
        ip(&["link", "set", &me.veth, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", &peer])?;
        ip(&["-n", ns, "link", "set", &peer, "up"])?;
        Ok(me)
    }

    /// The namespace's address.
    pub(crate) fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// Runs `f` on a thread of its own inside the namespace: what it binds stays
    /// there once the thread has ended.
    pub(crate) fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
        paddock_engines::netns::run_in(self.fd.as_fd(), f)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // The veth first: a socket still open in the namespace keeps it alive after
        // its name is gone, and deleting one end of the pair deletes both.
        let _ = ip(&["link", "del", &self.veth]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subnet_is_chosen_off_every_route_of_the_host() {
        let p = |s| parse_prefix(s).unwrap();
        assert_eq!(parse_prefix("default"), None);
        assert_eq!(
            free_subnet(&[p("127.0.0.0/8"), p("192.0.2.0/24")], 7),
            Some(Ipv4Addr::new(10, 250, 7, 0))
        );
        assert_eq!(
            free_subnet(&[p("10.250.7.0/24"), p("10.250.8.9")], 7),
            Some(Ipv4Addr::new(10, 250, 9, 0))
        );
        assert_eq!(
            free_subnet(&[p("10.0.0.0/8")], 300),
            Some(Ipv4Addr::new(172, 30, 44, 0))
        );
        assert_eq!(
            free_subnet(
                &[p("10.0.0.0/8"), p("172.16.0.0/12"), p("192.168.0.0/16")],
                0
            ),
            None
        );
    }
}
