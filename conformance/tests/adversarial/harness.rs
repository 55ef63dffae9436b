//! Runs one case against one target and checks that the host is unaffected.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{
    EngineName, ExecRequest, ExecResult, ExecutionId, Language, Program, SandboxSpec,
};
use paddock_engines::container::ContainerEngine;
use paddock_engines::{ContainerConfig, HandlerConfig};
use paddock_pool::audit::AuditConfig;
use paddock_pool::{Execute, Paddock, SandboxHandle};

/// Where a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The subprocess engine, cold `sh -c` commands (warm workers off).
    Subprocess,
    /// The subprocess engine's warm Python workers (`Code` in Python).
    WarmPython,
    /// QuickJS isolates (`Code` in JavaScript).
    Isolate,
    /// The container engine with warm containers (`sh -c` commands).
    Container,
    /// The container engine with a container per execution.
    ContainerCold,
}

/// The language a target's hostile programs are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lang {
    /// `sh -c` commands.
    Shell,
    /// Python `Code`.
    Python,
    /// JavaScript `Code`.
    Js,
}

impl Target {
    pub(crate) fn engine(self) -> EngineName {
        match self {
            Target::Subprocess | Target::WarmPython => EngineName::SUBPROCESS,
            Target::Isolate => EngineName::ISOLATE,
            Target::Container | Target::ContainerCold => EngineName::CONTAINER,
        }
    }

    pub(crate) fn lang(self) -> Lang {
        match self {
            Target::Subprocess | Target::Container | Target::ContainerCold => Lang::Shell,
            Target::WarmPython => Lang::Python,
            Target::Isolate => Lang::Js,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Target::Subprocess => "subprocess",
            Target::WarmPython => "warm_python",
            Target::Isolate => "isolate",
            Target::Container => "container",
            Target::ContainerCold => "container_cold",
        }
    }

    /// Whether this host can run the target.
    fn available(self) -> Result<(), String> {
        if self.engine() != EngineName::CONTAINER {
            return Ok(());
        }
        static FOUND: OnceLock<Result<(), String>> = OnceLock::new();
        FOUND
            .get_or_init(|| {
                ContainerEngine::new(&ContainerConfig::default())
                    .map(drop)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }
}

/// How a case stops early.
#[derive(Debug)]
pub(crate) enum Stop {
    /// The engine cannot defend against this; the reason says why (and what was seen).
    Skip(String),
    /// The contract was broken.
    Fail(String),
}

/// What a case returns: `Ok(())` is a pass.
pub(crate) type Check = Result<(), Stop>;

/// The body of a case.
pub(crate) type CaseFn = fn(Arc<H>) -> Pin<Box<dyn Future<Output = Check> + Send>>;

/// Environment variables planted in this process before any engine starts: they look
/// secret, and no program may see them.
pub(crate) const HOST_SECRETS: &[(&str, &str)] = &[
    ("AWS_SECRET_ACCESS_KEY", "adversarial-aws-secret-4f1c"),
    ("PADDOCK_ADVERSARIAL_TOKEN", "adversarial-token-9d27"),
    ("DATABASE_PASSWORD", "adversarial-db-password-77ae"),
];

/// The handler the subprocess targets register (Python, standard library only). It
/// answers by `input.op`: `echo`, `garbage` (a line that is not JSON), `version` (a
/// frame of protocol version 99), `stranger` (an answer for another id), `huge` (a
/// 32 MiB line), `hang` (never answers), `die-mid-frame` (half a frame, then exit).
const HANDLER: &str = r#"
import json, os, sys, time
def send(frame):
    sys.stdout.write(json.dumps(dict({"v": 1}, **frame)) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    frame = json.loads(line)
    fid = frame["id"]
    op = (frame.get("input") or {}).get("op")
    if op == "echo":
        send({"kind": "output", "id": fid, "output": frame["input"]})
    elif op == "garbage":
        sys.stdout.write("this is not a frame\n")
        sys.stdout.flush()
    elif op == "version":
        sys.stdout.write(json.dumps({"v": 99, "kind": "output", "id": fid, "output": 1}) + "\n")
        sys.stdout.flush()
    elif op == "stranger":
        send({"kind": "output", "id": "not-" + fid, "output": 1})
    elif op == "huge":
        sys.stdout.write('{"v":1,"kind":"log","id":"' + fid + '","stream":"stdout","data":"' + "x" * (32 << 20))
        sys.stdout.flush()
        time.sleep(3600)
    elif op == "hang":
        time.sleep(3600)
    elif op == "die-mid-frame":
        sys.stdout.write('{"v":1,"kind":"output","id":"' + fid + '","output":')
        sys.stdout.flush()
        os._exit(1)
"#;

/// The name the handler is registered under.
pub(crate) const HANDLER_NAME: &str = "adversary";

/// A running case: its target, its `Paddock` and what the checks need.
pub(crate) struct H {
    pub(crate) target: Target,
    /// A token in the command line of every process a hostile program leaves behind
    /// (`sleep <token>`, or a comment in a shell script): a live one is a survivor.
    pub(crate) token: String,
    /// The directory the engines keep their workdirs in.
    pub(crate) root: PathBuf,
    paddock: Mutex<Paddock>,
    audit: Arc<Mutex<HashMap<ExecutionId, u32>>>,
    /// Executions accepted by the `Paddock`s a restart replaced.
    accepted_before: Mutex<u64>,
    /// Whether the pool may end degraded (the engine-failure case).
    allow_degraded: Mutex<bool>,
    /// Names of the container engines' directories (their cgroups share them).
    container_names: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for H {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H")
            .field("target", &self.target)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl H {
    /// The configuration the target runs with: a pool of at most two instances, the
    /// workdirs under the case's own directory, the test handler registered.
    pub(crate) fn config(&self) -> PaddockConfig {
        config_for(self.target, &self.root)
    }

    /// Starts a `Paddock` for the target with `config`, replacing the running one
    /// (which is shut down first).
    pub(crate) async fn restart(&self, config: PaddockConfig) -> Result<(), Stop> {
        let old = self.paddock();
        let accepted = old
            .stats()
            .await
            .map(|s| s.accepted_total.unwrap_or_default())
            .unwrap_or(0);
        *lock(&self.accepted_before) += accepted;
        let _ = old.shutdown(Duration::from_secs(10)).await;
        let fresh = start(self.target, config, self.audit.clone())
            .map_err(|e| Stop::Fail(format!("Paddock::start: {e}")))?;
        *lock(&self.paddock) = fresh;
        *lock(&self.allow_degraded) = false;
        self.note_container_names();
        Ok(())
    }

    /// Starts a `Paddock` with `config` beside the case's own, for cases that expect
    /// the start itself to refuse.
    pub(crate) fn try_start(&self, config: PaddockConfig) -> Result<Paddock, paddock_core::Error> {
        start(self.target, config, self.audit.clone())
    }

    /// Shuts down a `Paddock` from [`H::try_start`], counting what it accepted.
    pub(crate) async fn retire(&self, paddock: Paddock) {
        let accepted = paddock
            .stats()
            .await
            .map(|s| s.accepted_total.unwrap_or_default())
            .unwrap_or(0);
        *lock(&self.accepted_before) += accepted;
        let _ = paddock.shutdown(Duration::from_secs(10)).await;
    }

    fn note_container_names(&self) {
        if let Ok(entries) = std::fs::read_dir(self.root.join("container")) {
            let mut names = lock(&self.container_names);
            for e in entries.flatten() {
                names.insert(e.file_name().to_string_lossy().into_owned());
            }
        }
    }

    /// The running `Paddock`.
    pub(crate) fn paddock(&self) -> Paddock {
        lock(&self.paddock).clone()
    }

    /// Lets the pools end degraded (until the next restart).
    pub(crate) fn allow_degraded(&self) {
        *lock(&self.allow_degraded) = true;
    }

    /// A request running the target's program: `sh -c shell`, Python `python` or
    /// JavaScript `js`, with a 30 s deadline.
    pub(crate) fn program(&self, shell: &str, python: &str, js: &str) -> ExecRequest {
        let program = match self.target.lang() {
            Lang::Shell => Program::command(["sh", "-c", shell]),
            Lang::Python => Program::code(Language::Python, python),
            Lang::Js => Program::code(Language::Javascript, js),
        };
        ExecRequest::new(program).with_timeout_ms(30_000)
    }

    /// Runs `request` on the target's engine through the whole scheduler and returns
    /// its answer, a refusal included.
    pub(crate) async fn answer(
        &self,
        request: ExecRequest,
    ) -> Result<ExecResult, paddock_core::Error> {
        self.paddock()
            .execute_with(Execute::new(request).on(self.target.engine()))
            .await
    }

    /// [`H::answer`], where a refusal fails the case.
    pub(crate) async fn exec(&self, request: ExecRequest) -> Result<ExecResult, Stop> {
        let what = format!("{:?}", request.program);
        self.answer(request)
            .await
            .map_err(|e| Stop::Fail(format!("execute {}: {e}", clip(&what, 200))))
    }

    /// A sandbox session on the target's engine.
    pub(crate) async fn sandbox(&self) -> Result<SandboxHandle, Stop> {
        self.sandbox_with(SandboxSpec::default()).await
    }

    /// A sandbox session on the target's engine, opened with `spec`.
    pub(crate) async fn sandbox_with(&self, spec: SandboxSpec) -> Result<SandboxHandle, Stop> {
        self.paddock()
            .open_sandbox(spec, Some(self.target.engine()))
            .await
            .map_err(|e| Stop::Fail(format!("open_sandbox: {e}")))
    }

    /// Processes still alive whose command line carries the case's token.
    pub(crate) fn survivors(&self) -> Vec<String> {
        processes()
            .into_iter()
            .filter(|p| p.cmdline.contains(&self.token))
            .map(|p| format!("{} `{}`", p.pid, clip(&p.cmdline, 120)))
            .collect()
    }

    /// Fails unless no process carrying the token is alive within a short grace (the
    /// kernel finishes a kill asynchronously; the engines wait for their cgroups to
    /// empty, so this normally holds at once).
    pub(crate) async fn no_survivors(&self, after: &str) -> Check {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let left = self.survivors();
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                fail!("processes survived {after}: {left:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many audit entries the execution `id` has.
    pub(crate) fn audit_count(&self, id: &ExecutionId) -> u32 {
        lock(&self.audit).get(id).copied().unwrap_or(0)
    }
}

/// The configuration `target` runs with: a pool of at most two instances, the
/// workdirs under `root`, the test handler registered.
fn config_for(target: Target, root: &Path) -> PaddockConfig {
    let mut c = PaddockConfig::default();
    c.subprocess.workdir_root = Some(root.join("subprocess"));
    c.isolate.workdir_root = Some(root.join("isolate"));
    c.container.workdir_root = Some(root.join("container"));
    c.pool.min_idle = 1;
    c.pool.max_size = 2;
    c.pool.max_waiting = 32;
    c.pool.acquire_timeout_ms = 60_000;
    c.audit.ring_capacity = 32_768;
    c.subprocess.warm.enabled = target == Target::WarmPython;
    c.subprocess.warm.languages = vec![Language::Python];
    c.container.warm = target != Target::ContainerCold;
    c.subprocess.handlers.insert(
        HANDLER_NAME.into(),
        HandlerConfig {
            command: vec![
                "python3".into(),
                root.join("handler.py").to_string_lossy().into_owned(),
            ],
        },
    );
    c.isolate.handlers.insert(
        HANDLER_NAME.into(),
        "(input) => { if (input && input.op === 'hang') { while (true) {} } return input; }".into(),
    );
    c
}

/// Fails unless a sandbox's workdir `root` is gone or empty after `what` (a
/// destroyed sandbox's instance is recycled for the next one, workdir included).
pub(crate) fn emptied(root: &std::path::Path, what: &str) -> Check {
    let left: Vec<String> = match std::fs::read_dir(root) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .take(10)
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Stop::Fail(format!("reading {}: {e}", root.display()))),
    };
    if left.is_empty() {
        Ok(())
    } else {
        Err(Stop::Fail(format!(
            "the workdir {} still holds {left:?} after {what}",
            root.display()
        )))
    }
}

/// At most `max` characters of `s`.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

fn start(
    target: Target,
    config: PaddockConfig,
    audit: Arc<Mutex<HashMap<ExecutionId, u32>>>,
) -> Result<Paddock, paddock_core::Error> {
    for dir in [
        &config.subprocess.workdir_root,
        &config.isolate.workdir_root,
        &config.container.workdir_root,
    ]
    .into_iter()
    .flatten()
    {
        let _ = std::fs::create_dir_all(dir);
    }
    let ring = config.audit.ring_capacity;
    let mut builder = paddock::builder()
        .config(config)
        .audit(AuditConfig {
            ring_capacity: ring,
            ..AuditConfig::default()
        })
        .on_audit(move |entry| {
            *lock(&audit).entry(entry.id.clone()).or_insert(0) += 1;
        });
    builder = match target.engine().as_str() {
        "subprocess" => builder.without_isolate().without_container(),
        "isolate" => builder
            .without_subprocess()
            .without_container()
            .default_engine(EngineName::ISOLATE),
        _ => builder
            .without_subprocess()
            .without_isolate()
            .default_engine(EngineName::CONTAINER),
    };
    builder.start()
}

/// One process of the host.
#[derive(Debug, Clone)]
pub(crate) struct Proc {
    pub(crate) pid: u32,
    ppid: u32,
    pub(crate) cmdline: String,
    cgroup: String,
}

/// The network namespaces of every process of the host and of this process's open
/// descriptors (`net:[inode]`).
fn network_namespaces() -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for p in procs.flatten() {
            if let Ok(link) = std::fs::read_link(p.path().join("ns/net")) {
                seen.insert(link.to_string_lossy().into_owned());
            }
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                let link = link.to_string_lossy().into_owned();
                if link.starts_with("net:[") {
                    seen.insert(link);
                }
            }
        }
    }
    seen
}

/// Every live (not zombie) process of the host.
pub(crate) fn processes() -> Vec<Proc> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r.trim().to_string()) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        if state == "Z" || state == "X" {
            continue;
        }
        let ppid = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let cmdline = std::fs::read(e.path().join("cmdline"))
            .map(|b| {
                String::from_utf8_lossy(&b)
                    .replace('\0', " ")
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        out.push(Proc {
            pid,
            ppid,
            cmdline,
            cgroup,
        });
    }
    out
}

/// Descendants of this process, and processes in the engines' cgroups.
fn engine_processes(container_names: &BTreeSet<String>) -> Vec<String> {
    let all = processes();
    let me = std::process::id();
    let cgroup_prefix = format!("/paddock-{me}-");
    let parents: HashMap<u32, u32> = all.iter().map(|p| (p.pid, p.ppid)).collect();
    let descends = |mut pid: u32| {
        for _ in 0..64 {
            match parents.get(&pid) {
                Some(&pp) if pp == me => return true,
                Some(&pp) if pp > 1 => pid = pp,
                _ => return false,
            }
        }
        false
    };
    all.iter()
        .filter(|p| p.pid != me)
        .filter(|p| {
            descends(p.pid)
                || p.cgroup.contains(&cgroup_prefix)
                || container_names
                    .iter()
                    .any(|n| p.cgroup.contains(&format!("/{n}")))
        })
        .map(|p| format!("{} `{}`", p.pid, clip(&p.cmdline, 120)))
        .collect()
}

/// Cgroups and mounts of this process's engines.
fn leftover_groups_and_mounts(root: &Path, container_names: &BTreeSet<String>) -> Vec<String> {
    let prefix = format!("paddock-{}-", std::process::id());
    let ours = |name: &str| name.starts_with(&prefix) || container_names.contains(name);
    let mut found = Vec::new();
    let mut walk = vec![(PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = walk.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if ours(&name) {
                found.push(format!("cgroup {}", e.path().display()));
            } else if depth < 6 {
                walk.push((e.path(), depth + 1));
            }
        }
    }
    let root = root.to_string_lossy().into_owned();
    if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
        found.extend(
            mounts
                .lines()
                .filter(|l| l.contains(&root) || container_names.iter().any(|n| l.contains(n)))
                .map(|l| format!("mount {l}")),
        );
    }
    found
}

/// Files and directories left under the engines' workdir roots.
fn leftover_files(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for sub in ["subprocess", "isolate", "container"] {
        let mut walk = vec![(root.join(sub), 0)];
        while let Some((dir, depth)) = walk.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if depth < 2 && e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk.push((e.path(), depth + 1));
                }
                found.push(e.path().display().to_string());
            }
        }
    }
    found
}

/// This process's open descriptors, with what they point at.
fn open_fds() -> BTreeSet<String> {
    std::fs::read_dir("/proc/self/fd")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let target = std::fs::read_link(e.path())
                        .map(|t| t.display().to_string())
                        .unwrap_or_default();
                    format!("{} -> {target}", e.file_name().to_string_lossy())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `probe` until it returns nothing or `patience` has passed, and returns its
/// last answer.
async fn settle<T>(patience: Duration, mut probe: impl FnMut() -> Vec<T>) -> Vec<T> {
    let deadline = Instant::now() + patience;
    loop {
        let found = probe();
        if found.is_empty() || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

fn plant_host_secrets() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (name, value) in HOST_SECRETS {
            std::env::set_var(name, value);
        }
    });
}

/// Runs `case` against `target`, then checks the host. Panics on a failure.
pub(crate) fn run(target: Target, case: &str, body: CaseFn) {
    let _serial = lock(&SERIAL);
    plant_host_secrets();
    if let Err(why) = target.available() {
        if std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() {
            panic!(
                "PADDOCK_REQUIRE_CONTAINERS is set, but the container engine cannot start: {why}"
            );
        }
        println!("adversarial {case} [{}]: skipped: {why}", target.name());
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // The runtime's own descriptors belong to the baseline, and so do those of the
    // egress gateways' process-wide runtime (started once, on first use).
    runtime.block_on(async { tokio::task::yield_now().await });
    paddock_egress::start_runtime();
    let fds_before = open_fds();
    let (verdict, problems) = runtime.block_on(run_case(target, body));
    let extra_fds: Vec<String> = {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let now = open_fds();
            let extra: Vec<String> = now.difference(&fds_before).cloned().collect();
            if now.len() <= fds_before.len() || Instant::now() > deadline {
                break if now.len() > fds_before.len() {
                    extra
                } else {
                    Vec::new()
                };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    drop(runtime);
    let mut problems = problems;
    if !extra_fds.is_empty() {
        problems.push(format!(
            "open descriptors did not return to their baseline of {}: {extra_fds:?}",
            fds_before.len()
        ));
    }
    let name = target.name();
    match verdict {
        Err(Stop::Fail(message)) => {
            panic!("adversarial {case} [{name}] FAILED: {message}\nhost checks: {problems:?}")
        }
        _ if !problems.is_empty() => {
            panic!("adversarial {case} [{name}] left the host changed: {problems:#?}")
        }
        Err(Stop::Skip(why)) => println!("adversarial {case} [{name}]: skipped: {why}"),
        Ok(()) => println!("adversarial {case} [{name}]: passed"),
    }
}

async fn run_case(target: Target, body: CaseFn) -> (Check, Vec<String>) {
    let dir = tempfile::Builder::new()
        .prefix("paddock-adversarial-")
        .tempdir()
        .expect("a temp dir");
    let root = dir.path().to_path_buf();
    if let Err(e) = std::fs::write(root.join("handler.py"), HANDLER) {
        return (Err(Stop::Fail(format!("writing the handler: {e}"))), vec![]);
    }
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() % 1_000_000)
        .unwrap_or(0);
    let audit = Arc::new(Mutex::new(HashMap::new()));
    let namespaces_before = network_namespaces();
    let paddock = match start(target, config_for(target, &root), audit.clone()) {
        Ok(p) => p,
        Err(e) => return (Err(Stop::Fail(format!("Paddock::start: {e}"))), vec![]),
    };
    let h = Arc::new(H {
        target,
        token: format!("9{:03}.{nonce:06}", std::process::id() % 1000),
        root: root.clone(),
        paddock: Mutex::new(paddock),
        audit,
        accepted_before: Mutex::new(0),
        allow_degraded: Mutex::new(false),
        container_names: Mutex::new(BTreeSet::new()),
    });
    h.note_container_names();
    let verdict = match tokio::time::timeout(Duration::from_secs(300), body(h.clone())).await {
        Ok(v) => v,
        Err(_) => Err(Stop::Fail("the case did not finish within 300 s".into())),
    };
    h.note_container_names();
    let mut problems = Vec::new();
    if let Err(Stop::Fail(m)) = h.no_survivors("the case").await {
        problems.push(m);
    }
    problems.extend(pool_problems(&h).await);
    problems.extend(audit_problems(&h).await);
    let paddock = h.paddock();
    if let Err(e) = paddock.shutdown(Duration::from_secs(10)).await {
        problems.push(format!("shutdown: {e}"));
    }
    drop(paddock);
    let names = lock(&h.container_names).clone();
    drop(h);
    let left = settle(Duration::from_secs(10), || engine_processes(&names)).await;
    if !left.is_empty() {
        problems.push(format!(
            "processes of the engines outlived shutdown: {left:?}"
        ));
    }
    let left = settle(Duration::from_secs(5), || leftover_files(&root)).await;
    if !left.is_empty() {
        problems.push(format!("workdirs outlived shutdown: {left:?}"));
    }
    let left = settle(Duration::from_secs(5), || {
        leftover_groups_and_mounts(&root, &names)
    })
    .await;
    if !left.is_empty() {
        problems.push(format!("cgroups or mounts outlived shutdown: {left:?}"));
    }
    // A sandbox's network namespace (an allowlist's gateway's included) lives while a
    // process is in it or a descriptor holds it: none may be left.
    let left = settle(Duration::from_secs(5), || {
        network_namespaces()
            .into_iter()
            .filter(|n| !namespaces_before.contains(n))
            .collect::<Vec<_>>()
    })
    .await;
    if !left.is_empty() {
        problems.push(format!("network namespaces outlived shutdown: {left:?}"));
    }
    drop(dir);
    (verdict, problems)
}

/// What is wrong with the pools once they have had 15 s to settle.
async fn pool_problems(h: &H) -> Vec<String> {
    let allow_degraded = *lock(&h.allow_degraded);
    let paddock = h.paddock();
    let min_idle = h.config().pool.min_idle;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let problems = match paddock.stats().await {
            Err(e) => vec![format!("stats: {e}")],
            Ok(stats) => {
                let mut p = Vec::new();
                if stats.in_flight != 0 {
                    p.push(format!("{} executions still in flight", stats.in_flight));
                }
                if stats.sandboxes != 0 {
                    p.push(format!("{} sandbox sessions still open", stats.sandboxes));
                }
                for pool in &stats.pools {
                    // Pools of executions' own disk quotas, and of networks other
                    // than `none`, are not prewarmed.
                    let own_disk = pool.disk_bytes.is_some() || pool.disk_files.is_some();
                    let min_idle = if own_disk || pool.network != "none" {
                        0
                    } else {
                        min_idle
                    };
                    let healthy = pool.busy == 0
                        && pool.waiting == 0
                        && pool.creating == 0
                        && pool.size <= pool.max_size
                        && (allow_degraded || (!pool.degraded && pool.size >= min_idle));
                    if !healthy {
                        p.push(format!("pool not healthy: {pool:?}"));
                    }
                }
                p
            }
        };
        if problems.is_empty() || Instant::now() > deadline {
            return problems;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Exactly one audit entry per accepted execution.
async fn audit_problems(h: &H) -> Vec<String> {
    let paddock = h.paddock();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // The counts span every `Paddock` the case started.
        let accepted = match paddock.stats().await {
            Ok(s) => s.accepted_total.unwrap_or_default() + *lock(&h.accepted_before),
            Err(e) => return vec![format!("stats: {e}")],
        };
        let (entries, twice): (u64, Vec<ExecutionId>) = {
            let audit = lock(&h.audit);
            (
                audit.values().map(|&n| u64::from(n)).sum(),
                audit
                    .iter()
                    .filter(|(_, &n)| n > 1)
                    .map(|(id, _)| id.clone())
                    .collect(),
            )
        };
        if !twice.is_empty() {
            return vec![format!("executions audited more than once: {twice:?}")];
        }
        if entries == accepted || Instant::now() > deadline {
            return if entries == accepted {
                Vec::new()
            } else {
                vec![format!(
                    "{accepted} executions accepted, {entries} audit entries"
                )]
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
