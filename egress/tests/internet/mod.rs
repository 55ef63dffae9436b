//! A small internet for the egress tests, on this machine only: a network namespace
//! the test makes, joined to the host's by a veth pair, holding HTTP(S) servers for
//! `allowed.test` and `denied.test`, a UDP echo, and a DNS server that names them.
//! Its addresses are documentation ones (198.51.100.0/24), routed only over that
//! veth. Dropping it removes the namespace, and the veth with it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The servers' addresses.
pub const HOST_SIDE: &str = "198.51.100.1";
pub const ALLOWED: &str = "198.51.100.2";
pub const DENIED: &str = "198.51.100.3";
pub const DNS: &str = "198.51.100.53";

pub struct Internet {
    pub ns: String,
    pub veth: String,
    pub certs: tempfile::TempDir,
    servers: Child,
    /// One internet at a time in a process: each puts the same addresses behind a
    /// veth of its own, and two would contend for their routes.
    _one: std::sync::MutexGuard<'static, ()>,
}

static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Why the internet cannot be built here, if it cannot: not root, or no `ip`,
/// `openssl` or `python3`.
pub fn unavailable() -> Option<String> {
    if unsafe_euid() != 0 {
        return Some("not root".into());
    }
    for tool in ["ip", "openssl", "python3", "curl"] {
        if which(tool).is_none() {
            return Some(format!("no `{tool}`"));
        }
    }
    None
}

fn unsafe_euid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        })
        .and_then(|u| u.parse().ok())
        .unwrap_or(u32::MAX)
}

pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Makes a test CA and a certificate for each of `names`, in `dir`.
fn certificates(dir: &Path, names: &[&str]) -> Result<(), String> {
    let d = |f: &str| dir.join(f);
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=paddock egress test CA",
        ])
        .arg("-keyout")
        .arg(d("ca.key"))
        .arg("-out")
        .arg(d("ca.crt")))?;
    for name in names {
        run(Command::new("openssl")
            .args([
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
            ])
            .arg(format!("/CN={name}"))
            .arg("-keyout")
            .arg(d(&format!("{name}.key")))
            .arg("-out")
            .arg(d(&format!("{name}.csr"))))?;
        std::fs::write(
            d(&format!("{name}.ext")),
            format!("subjectAltName=DNS:{name}\n"),
        )
        .map_err(|e| e.to_string())?;
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
            .arg("-in")
            .arg(d(&format!("{name}.csr")))
            .arg("-CA")
            .arg(d("ca.crt"))
            .arg("-CAkey")
            .arg(d("ca.key"))
            .arg("-extfile")
            .arg(d(&format!("{name}.ext")))
            .arg("-out")
            .arg(d(&format!("{name}.crt"))))?;
    }
    Ok(())
}

/// Removes what an earlier run that died left: namespaces named for a pid that is
/// gone.
fn sweep() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("pdkinet-")
            .and_then(|p| p.split('-').next())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
    }
}

impl Internet {
    /// Builds it; `tag` keeps two tests of one process apart (a letter or two).
    pub fn start(tag: &str) -> Result<Internet, String> {
        let one = ONE.lock().unwrap_or_else(|p| p.into_inner());
        sweep();
        let pid = std::process::id();
        let ns = format!("pdkinet-{pid}-{tag}");
        // The host's end: at most 15 bytes.
        let veth = format!("pdk{}{tag}", pid % 100_000);
        let peer = format!("{veth}p");
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = Command::new("ip").args(["link", "del", &veth]).output();
        run(Command::new("ip").args(["netns", "add", &ns]))?;
        let me = Internet {
            ns: ns.clone(),
            veth: veth.clone(),
            certs: tempfile::tempdir().map_err(|e| e.to_string())?,
            servers: Command::new("true").spawn().map_err(|e| e.to_string())?,
            _one: one,
        };
        run(Command::new("ip").args([
            "link", "add", &veth, "type", "veth", "peer", "name", &peer, "netns", &ns,
        ]))?;
        run(Command::new("ip").args(["addr", "add", &format!("{HOST_SIDE}/24"), "dev", &veth]))?;
        run(Command::new("ip").args(["link", "set", &veth, "up"]))?;
        let inside = |args: &[&str]| {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns]).args(args);
            run(&mut c)
        };
        inside(&["ip", "link", "set", "lo", "up"])?;
        for a in [ALLOWED, DENIED, DNS] {
            inside(&["ip", "addr", "add", &format!("{a}/24"), "dev", &peer])?;
        }
        inside(&["ip", "link", "set", &peer, "up"])?;
        certificates(me.certs.path(), &["allowed.test", "denied.test"])?;
        let mut me = me;
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../egress/tests/internet/servers.py");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-u"])
            .arg(&script)
            .args([ALLOWED, DENIED, DNS])
            .arg(me.certs.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let _ = std::mem::replace(&mut me.servers, child).wait();
        if line.trim() != "ready" {
            return Err(format!("the test's servers did not start: {line:?}"));
        }
        Ok(me)
    }

    /// The DNS server, for the gateway's upstream.
    pub fn resolver(&self) -> SocketAddr {
        format!("{DNS}:53").parse().unwrap()
    }

    /// The test CA's certificate.
    pub fn ca(&self) -> PathBuf {
        self.certs.path().join("ca.crt")
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        let _ = self.servers.kill();
        let _ = self.servers.wait();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
    }
}
