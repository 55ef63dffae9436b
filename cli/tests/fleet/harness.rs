//! The fleet under test: NATS servers clustered on loopback ports and `paddock serve`
//! nodes, all started here and all killed (and waited for) when the harness is
//! dropped, so that no process outlives a test, whether it passes or panics. The
//! pieces the fleet's own tests share (`paddock_testkit::fleet`) come with it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub use paddock_testkit::fleet::*;

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Three (or more) NATS servers clustered on loopback ports.
pub struct Cluster {
    inner: paddock_fleet::local::LocalCluster,
}

impl Cluster {
    pub fn start(binary: &Path, size: usize) -> Cluster {
        Cluster {
            inner: paddock_fleet::local::LocalCluster::start(binary, size).expect("a NATS cluster"),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.inner.urls()
    }

    pub fn dir(&self) -> &Path {
        self.inner.dir()
    }

    pub fn server(&mut self, name: &str) -> &mut paddock_fleet::local::LocalServer {
        self.inner
            .server(name)
            .unwrap_or_else(|| panic!("no server {name}"))
    }
}

/// One `paddock serve` node.
pub struct Node {
    pub id: String,
    pub url: String,
    config: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    /// Starts node `id` joined through `urls`, with `extra` TOML appended to its
    /// config (the `[fleet]` table is written here; give other tables).
    pub fn start(dir: &Path, id: &str, urls: &[String], fleet: &str, extra: &str) -> Node {
        let config = dir.join(format!("{id}.toml"));
        let urls_toml: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
        // One ready sandbox per pool unless the test sets its own `[pool]`: nodes
        // keeping the default eight would make dozens at start on two cores, which
        // these tests do not use.
        let pool = if extra.contains("[pool]") {
            ""
        } else {
            "[pool]\nmin_idle = 1\n"
        };
        let text = format!(
            "[fleet]\nurls = [{}]\nnode_id = \"{id}\"\n{fleet}\n{extra}\n{pool}",
            urls_toml.join(", ")
        );
        std::fs::write(&config, text).expect("writing a node config");
        let mut node = Node {
            id: id.to_string(),
            url: String::new(),
            config,
            args: Vec::new(),
            log: dir.join(format!("{id}.log")),
            child: None,
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the node's log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_paddock"))
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--config")
            .arg(&self.config)
            .args(&self.args)
            .env("RUST_LOG", "paddock_fleet=info")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("starting paddock serve");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        if read.is_err() || !line.starts_with("http://") {
            kill(&mut child);
            panic!(
                "node {} did not start: {line:?}; its log:\n{}",
                self.id,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        self.url = line.trim().to_string();
        self.child = Some(child);
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill(&mut c);
        }
    }

    /// Starts it again with the same id and config (a new incarnation).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A stopped process must run again to die of anything but SIGKILL; SIGKILL
        // works on it as it is.
        self.kill();
        // A failed test shows what each node said last.
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(30)..];
            eprintln!(
                "--- the end of node {}'s log ---\n{}",
                self.id,
                tail.join("\n")
            );
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

    /// Every descendant of its process.
    fn programs(&self) -> Vec<u32> {
        self.pid().map(descendants).unwrap_or_default()
    }
}
