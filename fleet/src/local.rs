//! A NATS cluster on loopback ports, for tests, benches and trying a fleet out on
//! one machine: `size` `nats-server` processes with JetStream, clustered with each
//! other, each with its store in a temporary directory. Dropping the cluster kills
//! its servers and waits for them, so none outlives it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `nats-server` to run: `PADDOCK_NATS_SERVER`, else the first on `PATH`.
pub fn find_server() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("PADDOCK_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// A free loopback port (bound, then released), never one this process was handed
/// before: clusters started side by side (tests run in parallel) would otherwise
/// be given each other's released ports, and one server's route port could be
/// taken for another's client port.
pub fn free_port() -> std::io::Result<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    // Hold each candidate until a new one is found, so that the kernel does not
    // hand the same one back at once.
    let mut held = Vec::new();
    for _ in 0..64 {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let port = l.local_addr()?.port();
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
        held.push(l);
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        "no loopback port left that this process has not used",
    ))
}

/// One server of a [`LocalCluster`].
#[derive(Debug)]
pub struct LocalServer {
    /// Its name in the cluster (`s1`, `s2`, …): what a stream's `leader` names.
    pub name: String,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    config: PathBuf,
    binary: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl LocalServer {
    /// Its client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        self.child = Some(
            Command::new(&self.binary)
                .arg("-c")
                .arg(&self.config)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        );
        Ok(())
    }

    /// Kills it (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        self.spawn()?;
        self.wait_ready(Duration::from_secs(20))
    }

    /// Waits until its port answers while it still runs: a listener on the port
    /// with this server gone is someone else's.
    fn wait_ready(&mut self, limit: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    self.child = None;
                    let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                    return Err(std::io::Error::other(format!(
                        "NATS server {} exited at start ({status}): {}",
                        self.name,
                        log.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
                    )));
                }
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                // The port answers; make sure it is this server that holds it.
                std::thread::sleep(Duration::from_millis(50));
                if let Some(c) = self.child.as_mut() {
                    if c.try_wait()?.is_none() {
                        return Ok(());
                    }
                }
                continue;
            }
            if Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no NATS server listens on port {}", self.port),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// NATS servers clustered on loopback ports, with JetStream.
#[derive(Debug)]
pub struct LocalCluster {
    /// The servers.
    pub servers: Vec<LocalServer>,
    dir: tempfile::TempDir,
}

impl LocalCluster {
    /// Starts `size` servers of `binary` and waits until each listens. Each takes
    /// messages of up to 8 MiB and stores up to 4 GiB of JetStream data.
    pub fn start(binary: &Path, size: usize) -> std::io::Result<LocalCluster> {
        LocalCluster::start_with(binary, size, 0)
    }

    /// [`start`](Self::start), with `plain` more servers in the cluster that run no
    /// JetStream (named `p1`, `p2`, …): clients reach the fleet's streams through
    /// them, and stopping one cuts off the clients that use it without disturbing
    /// any stream's replicas.
    ///
    /// A server that cannot take its ports (another process took one between their
    /// choosing and the server's start) ends the try; the cluster is started again
    /// on fresh ports, up to three times.
    pub fn start_with(binary: &Path, size: usize, plain: usize) -> std::io::Result<LocalCluster> {
        let mut tries = 0;
        loop {
            tries += 1;
            match LocalCluster::try_start(binary, size, plain) {
                Err(e) if tries < 3 && e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!("a local NATS cluster did not start, trying again: {e}");
                }
                done => return done,
            }
        }
    }

    fn try_start(binary: &Path, size: usize, plain: usize) -> std::io::Result<LocalCluster> {
        let dir = tempfile::tempdir()?;
        let mut ports = Vec::new();
        for _ in 0..size + plain {
            ports.push((free_port()?, free_port()?));
        }
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, r)| format!("nats-route://127.0.0.1:{r}"))
            .collect();
        let mut cluster = LocalCluster {
            servers: Vec::new(),
            dir,
        };
        for (i, (port, route)) in ports.iter().enumerate() {
            let name = if i < size {
                format!("s{}", i + 1)
            } else {
                format!("p{}", i - size + 1)
            };
            let store = cluster.dir.path().join(&name);
            let config = cluster.dir.path().join(format!("{name}.conf"));
            let jetstream = if i < size {
                format!(
                    "jetstream {{ store_dir: \"{}\", max_memory_store: 64MB, max_file_store: 4GB }}\n",
                    store.display()
                )
            } else {
                String::new()
            };
            let text = format!(
                "server_name: {name}\nlisten: 127.0.0.1:{port}\nmax_payload: 8MB\n{jetstream}\
                 cluster {{ name: paddock-local, listen: 127.0.0.1:{route}, routes: [{}] }}\n",
                routes.join(", ")
            );
            std::fs::write(&config, text)?;
            let mut s = LocalServer {
                log: cluster.dir.path().join(format!("{name}.log")),
                name,
                port: *port,
                config,
                binary: binary.to_path_buf(),
                child: None,
            };
            s.spawn()?;
            cluster.servers.push(s);
        }
        for s in &mut cluster.servers {
            s.wait_ready(Duration::from_secs(20))?;
        }
        Ok(cluster)
    }

    /// Every server's client URL.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(LocalServer::url).collect()
    }

    /// The server named `name`.
    pub fn server(&mut self, name: &str) -> Option<&mut LocalServer> {
        self.servers.iter_mut().find(|s| s.name == name)
    }

    /// The directory holding the servers' configs, stores and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for s in &mut self.servers {
            s.kill();
        }
    }
}
