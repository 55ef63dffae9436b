//! The fleet under test: NATS servers clustered on loopback ports (processes, killed
//! and waited for when the harness is dropped) and nodes in this process, each its
//! own Paddock, fleet membership and HTTP server on a loopback port, started by
//! `paddock::node::Node` as `paddock serve` starts one, and stopped when dropped,
//! whether the test passes or panics. The pieces the binary's fleet tests share
//! (`paddock_testkit::fleet`) come with it.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

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
/// `paddock serve` has) running a `paddock::node::Node` until the node is dropped.
pub struct Node {
    pub id: String,
    pub url: String,
    /// Where its subprocess engine makes its sandboxes' workdirs: what runs there
    /// is this node's.
    work: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
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
        let mut config = paddock::core::PaddockConfig::from_toml_str(&text).expect("a node config");
        config.server.listen = "127.0.0.1:0".into();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (started, url) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("node-{id}"))
            .spawn(move || run(config, started, stopped))
            .expect("the node's thread");
        let url = match url.recv() {
            Ok(Ok(url)) => url,
            Ok(Err(e)) => panic!("node {id} did not start: {e}"),
            Err(_) => panic!("node {id} did not start: its thread ended"),
        };
        Node {
            id: id.to_string(),
            url,
            work,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

/// The node's thread: starts it, says where it listens, and stops it (gracefully,
/// leaving the fleet, with no drain) when told to or when its handle is dropped.
fn run(
    config: paddock::core::PaddockConfig,
    started: mpsc::Sender<Result<String, String>>,
    stopped: tokio::sync::oneshot::Receiver<()>,
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
    rt.block_on(async move {
        let node = match paddock::node::Node::start(config).await {
            Ok(node) => node,
            Err(e) => {
                let _ = started.send(Err(e.to_string()));
                return;
            }
        };
        let _ = started.send(Ok(format!("http://{}", node.local_addr())));
        let _ = stopped.await;
        let _ = node.stop(Duration::ZERO).await;
    });
    rt.shutdown_timeout(Duration::from_secs(5));
}

impl Drop for Node {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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
