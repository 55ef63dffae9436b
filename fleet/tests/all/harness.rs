//! The fleet under test: NATS servers clustered on loopback ports (processes, killed
//! and waited for when the harness is dropped) and nodes in this process, each its
//! own Paddock, fleet membership and HTTP server on a loopback port, started by
//! `paddock::node::Node` as `paddock serve` starts one, and stopped when dropped,
//! whether the test passes or panics. The pieces the binary's fleet tests share
//! (`paddock_testkit::fleet`) come with it.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use paddock::PaddockConfig;
use paddock_fleet::local::{LocalCluster, LocalServer};
pub use paddock_testkit::fleet::*;

/// Three (or more) NATS servers clustered on loopback ports.
pub struct Cluster {
    inner: LocalCluster,
}

impl Cluster {
    pub fn start(binary: &Path, size: usize) -> Cluster {
        Cluster {
            inner: LocalCluster::start(binary, size).expect("a NATS cluster"),
        }
    }

    /// Three servers with JetStream and `plain` without (`p1`, …).
    pub fn start_with(binary: &Path, size: usize, plain: usize) -> Cluster {
        Cluster {
            inner: LocalCluster::start_with(binary, size, plain).expect("a NATS cluster"),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.inner.urls()
    }

    pub fn dir(&self) -> &Path {
        self.inner.dir()
    }

    pub fn server(&mut self, name: &str) -> &mut LocalServer {
        self.inner
            .server(name)
            .unwrap_or_else(|| panic!("no server {name}"))
    }
}

/// One node, in this process: a thread with its own runtime (two workers, as
/// `paddock serve` has) running a `paddock::node::Node` until the node is killed
/// or dropped.
pub struct Node {
    pub id: String,
    pub url: String,
    config: PaddockConfig,
    /// Where its subprocess engine makes its sandboxes' workdirs: what runs there
    /// is this node's.
    work: PathBuf,
    end: Option<tokio::sync::oneshot::Sender<End>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How a node's thread ends it.
enum End {
    /// Gracefully: it leaves the fleet.
    Stop,
    /// As a process killed with SIGKILL looks to the fleet: see [`Node::kill`].
    Crash,
}

impl Node {
    /// Starts node `id` joined through `urls`, with `extra` TOML appended to its
    /// config (the `[fleet]` table is written here; give other tables).
    pub fn start(dir: &Path, id: &str, urls: &[String], fleet: &str, extra: &str) -> Node {
        let urls_toml: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
        // One ready sandbox per pool unless the test sets its own `[pool]`: nodes
        // keeping the default eight would make dozens at start on two cores, which
        // these tests do not use.
        let pool = if extra.contains("[pool]") {
            ""
        } else {
            "[pool]\nmin_idle = 1\n"
        };
        let work = dir.join(format!("{id}-work"));
        std::fs::create_dir_all(&work).expect("the node's workdir root");
        let text = format!(
            "[fleet]\nurls = [{}]\nnode_id = \"{id}\"\n{fleet}\n{extra}\n{pool}\n[subprocess]\nworkdir_root = \"{}\"\n",
            urls_toml.join(", "),
            work.display()
        );
        let mut config = PaddockConfig::from_toml_str(&text).expect("a node config");
        config.server.listen = "127.0.0.1:0".into();
        let mut node = Node {
            id: id.to_string(),
            url: String::new(),
            config,
            work,
            end: None,
            thread: None,
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        let (end, ended) = tokio::sync::oneshot::channel();
        let (started, url) = mpsc::channel();
        let config = self.config.clone();
        let thread = std::thread::Builder::new()
            .name(format!("node-{}", self.id))
            .spawn(move || run(config, started, ended))
            .expect("the node's thread");
        // Set first, so that a node that fails the checks below is stopped too.
        self.end = Some(end);
        self.thread = Some(thread);
        self.url = match url.recv() {
            Ok(Ok((url, joined))) => {
                assert_eq!(
                    joined.as_deref(),
                    Some(self.id.as_str()),
                    "node {} joined",
                    self.id
                );
                url
            }
            Ok(Err(e)) => panic!("node {} did not start: {e}", self.id),
            Err(_) => panic!("node {} did not start: its thread ended", self.id),
        };
    }

    fn end(&mut self, how: End) {
        if let Some(end) = self.end.take() {
            let _ = end.send(how);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// The node dies as a process killed with SIGKILL does, as far as the fleet
    /// can tell: its runtime is dropped at once, with every task of its fleet
    /// membership (heartbeats, work consumers, leases) and its NATS connection,
    /// which closes with no last word; then, the connection gone, its scheduler is
    /// shut down with no drain (its programs and sandboxes killed) and its HTTP
    /// server stopped, so that its address answers nothing.
    pub fn kill(&mut self) {
        self.end(End::Crash);
    }

    /// Starts it again with the same id and config (a new incarnation).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

/// The node's thread: starts it, says where it listens, and ends it when told to
/// (or when its handle is dropped: gracefully, leaving the fleet, with no drain).
fn run(
    config: PaddockConfig,
    started: mpsc::Sender<Result<(String, Option<String>), String>>,
    ended: tokio::sync::oneshot::Receiver<End>,
) {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = started.send(Err(format!("its runtime: {e}")));
            return;
        }
    };
    let crashed = rt.block_on(async move {
        let node = match paddock::node::Node::start(config).await {
            Ok(node) => node,
            Err(e) => {
                let _ = started.send(Err(e.to_string()));
                return None;
            }
        };
        // The membership `paddock` composed is this crate's `Fleet`: one
        // `paddock-fleet` in this binary.
        let joined: Option<&paddock_fleet::Fleet> = node.fleet();
        let url = format!("http://{}", node.local_addr());
        let _ = started.send(Ok((url, joined.map(|f| f.node_id().to_string()))));
        match ended.await {
            Ok(End::Crash) => Some(node),
            Ok(End::Stop) | Err(_) => {
                let _ = node.stop(Duration::ZERO).await;
                None
            }
        }
    });
    // Its fleet's tasks and NATS connection end here.
    rt.shutdown_timeout(Duration::from_secs(5));
    if let Some(node) = crashed {
        // What is left: its leaving says nothing to a fleet it has no connection
        // to any more, and its scheduler and server stop.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let _ = tokio::time::timeout(Duration::from_secs(30), node.stop(Duration::ZERO)).await;
        });
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.end(End::Stop);
    }
}

impl FleetNode for Node {
    fn id(&self) -> &str {
        &self.id
    }

    fn url(&self) -> &str {
        &self.url
    }

    /// The processes under this test process whose working directory is in the
    /// node's workdir root (its subprocess engine's programs, and what they start
    /// there).
    fn programs(&self) -> Vec<u32> {
        descendants(std::process::id())
            .into_iter()
            .filter(|p| {
                std::fs::read_link(format!("/proc/{p}/cwd"))
                    .is_ok_and(|cwd| cwd.starts_with(&self.work))
            })
            .collect()
    }
}
