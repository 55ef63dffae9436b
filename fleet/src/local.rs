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

/// A free loopback port (bound, then released).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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
        wait_port(self.port, Duration::from_secs(20))
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

fn wait_port(port: u16, limit: Duration) -> std::io::Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no NATS server listens on port {port}"),
    ))
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
    pub fn start_with(binary: &Path, size: usize, plain: usize) -> std::io::Result<LocalCluster> {
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
        for s in &cluster.servers {
            wait_port(s.port, Duration::from_secs(20))?;
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
