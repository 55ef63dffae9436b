//! The Python fork server ("zygote"): one Python interpreter per engine with the
//! warm runner loaded, started outside every sandbox, that forks each sandbox's
//! Python runner instead of starting an interpreter for it.
//!
//! A fork costs about a millisecond where an interpreter start costs tens, and the
//! child shares the zygote's memory copy-on-write, so a sandbox's warm Python costs
//! little host memory and its first snippet does not wait for an interpreter.
//!
//! What keeps tenants apart (`docs/security.md`, "The Python fork server"):
//! - The zygote never runs tenant code. It imports the runner and the standard
//!   modules the runner uses, freezes its objects out of the collector's reach, and
//!   then only reads requests from the engine and forks. Every child starts from that
//!   state, which no snippet has touched; what a child writes is its own page.
//! - A child joins its sandbox before anything else runs in it: a session of its
//!   own, the sandbox's cgroups (written through descriptors the engine opened), its
//!   network and mount namespaces, its rlimits; then its stdio and frame pipes
//!   become fds 0–3 and every other descriptor is closed, the zygote's socket
//!   included; then the working directory and the environment are the sandbox's,
//!   exactly those a runner spawned for the sandbox gets (`spawn_spec`).
//! - The engine holds the child's pidfd (opened by the zygote before the child can
//!   be reaped), so that watching, interrupting and killing it never names another
//!   process; the zygote reaps it.
//!
//! The zygote is started on first use, with the interpreter the engine resolved, and
//! started again if it died. Any failure of the zygote itself (not of the sandbox)
//! falls back to spawning the runner, and is logged.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::host::spawn::{spawn, SpawnSpec, SpawnedChild};
use crate::host::sys;

/// How long the zygote may take to answer a fork request.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// Largest request the zygote reads (the environment is most of it).
const MAX_REQUEST: usize = 1 << 20;

/// The engine's Python fork server.
#[derive(Debug, Default)]
pub(crate) struct Zygote {
    live: parking_lot::Mutex<State>,
}

/// The server, and when one that broke may be tried again.
#[derive(Debug, Default)]
struct State {
    live: Option<Live>,
    /// A server that could not start, or broke right after it started, is not
    /// tried again before this (runners are spawned meanwhile).
    resting_until: Option<std::time::Instant>,
}

/// How long a server that broke rests before it is started again.
const REST: Duration = Duration::from_secs(60);

/// A running zygote.
#[derive(Debug)]
struct Live {
    /// The interpreter and script it runs.
    interp: PathBuf,
    script: PathBuf,
    /// Our end of its control socket (its fd 0).
    sock: OwnedFd,
    child: SpawnedChild,
}

impl Drop for Live {
    fn drop(&mut self) {
        // Its end of the socket sees EOF and it exits; it is reaped off this thread.
        let _ = sys::pidfd_send_signal(&self.child.pidfd, libc::SIGKILL);
        let pid = self.child.pid;
        std::thread::spawn(move || {
            let _ = sys::reap(pid);
        });
    }
}

/// A fork request's descriptors and settings, taken from the spawn spec a spawned
/// runner would get.
#[derive(Debug)]
pub(crate) struct ForkRequest {
    /// stdin, stdout, stderr and the frame pipe (fd 3).
    pub(crate) stdio: [OwnedFd; 4],
    /// Our own copies of the namespaces to enter.
    pub(crate) netns: Option<OwnedFd>,
    pub(crate) mntns: Option<OwnedFd>,
    /// `cgroup.procs` files to join.
    pub(crate) cgroup_procs: Vec<CString>,
    pub(crate) cwd: CString,
    pub(crate) env: Vec<CString>,
    pub(crate) rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
}

impl ForkRequest {
    /// The request for a runner that `spec` would start, on the child's `stdio`
    /// ends: the namespaces are copied (the spec only borrows them).
    pub(crate) fn from_spec(spec: &SpawnSpec, stdio: [OwnedFd; 4]) -> std::io::Result<Self> {
        let (netns, mntns) = spec.namespace_copies()?;
        Ok(ForkRequest {
            stdio,
            netns,
            mntns,
            cgroup_procs: spec.cgroup_procs.clone(),
            cwd: spec.cwd.clone(),
            env: spec.env.clone(),
            rlimits: spec.rlimits.clone(),
        })
    }
}

impl Zygote {
    /// Forks a runner for `request` from the zygote of `interp` running `script`
    /// (started, or started again, as needed): the child's pidfd. Blocking.
    pub(crate) fn fork(
        &self,
        interp: &Path,
        script: &Path,
        base_env: &std::collections::BTreeMap<String, String>,
        request: ForkRequest,
    ) -> std::io::Result<OwnedFd> {
        let (message, fds) = encode(request)?;
        let mut state = self.live.lock();
        if let Some(until) = state.resting_until {
            if std::time::Instant::now() < until {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "the Python fork server broke a moment ago and rests",
                ));
            }
            state.resting_until = None;
        }
        let fresh = !matches!(&state.live, Some(l) if l.interp == interp && l.script == script && !sys::pidfd_exited(&l.child.pidfd));
        if fresh {
            state.live = None;
            match start(interp, script, base_env) {
                Ok(l) => state.live = Some(l),
                Err(e) => {
                    state.resting_until = Some(std::time::Instant::now() + REST);
                    return Err(e);
                }
            }
        }
        let z = state.live.as_ref().expect("started above");
        match ask(z, &message, &fds) {
            Ok(pidfd) => Ok(pidfd),
            // The server answered: the request itself failed.
            Err(Fault::Refused(e)) => Err(e),
            // The server is gone or stuck. It is not asked again with these pipes
            // (a child it may have forked holds them, and sees them end when the
            // caller drops its own); the next request starts a new server, unless
            // this one broke at once.
            Err(Fault::Broken(e)) => {
                state.live = None;
                if fresh {
                    state.resting_until = Some(std::time::Instant::now() + REST);
                }
                Err(e)
            }
        }
    }
}

/// Why a request did not give a child.
enum Fault {
    /// The zygote answered with an error.
    Refused(std::io::Error),
    /// The zygote did not answer (gone, stuck, or talking nonsense).
    Broken(std::io::Error),
}

/// The request's message and the descriptors that go with it, in the order its
/// `fds` roles name them.
fn encode(request: ForkRequest) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut roles = vec!["stdin", "stdout", "stderr", "frames"];
    let mut fds: Vec<OwnedFd> = request.stdio.into();
    if let Some(fd) = request.netns {
        roles.push("netns");
        fds.push(fd);
    }
    if let Some(fd) = request.mntns {
        roles.push("mntns");
        fds.push(fd);
    }
    for path in &request.cgroup_procs {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(std::ffi::OsStr::from_bytes(path.as_bytes()))?;
        roles.push("cgroup");
        fds.push(file.into());
    }
    if fds.len() > sys::MAX_PASSED_FDS {
        return Err(std::io::Error::other(format!(
            "a fork request needs {} descriptors, more than the {} one message carries",
            fds.len(),
            sys::MAX_PASSED_FDS
        )));
    }
    let text = |c: &CString| String::from_utf8_lossy(c.as_bytes()).into_owned();
    let env: serde_json::Map<String, serde_json::Value> = request
        .env
        .iter()
        .filter_map(|e| {
            let e = text(e);
            let (k, v) = e.split_once('=')?;
            Some((k.to_string(), serde_json::Value::String(v.to_string())))
        })
        .collect();
    let message = serde_json::json!({
        "fds": roles,
        "cwd": text(&request.cwd),
        "env": env,
        "rlimits": request
            .rlimits
            .iter()
            .map(|(r, soft, hard)| serde_json::json!([r, rlim(*soft), rlim(*hard)]))
            .collect::<Vec<_>>(),
    });
    let bytes = serde_json::to_vec(&message).map_err(std::io::Error::other)?;
    if bytes.len() > MAX_REQUEST {
        return Err(std::io::Error::other(
            "the runner's environment is too large for a fork request",
        ));
    }
    Ok((bytes, fds))
}

/// An rlimit value as Python's `resource` module takes it (`RLIM_INFINITY` is -1).
fn rlim(v: u64) -> i64 {
    if v == libc::RLIM_INFINITY {
        -1
    } else {
        i64::try_from(v).unwrap_or(-1)
    }
}

/// Starts a zygote: `interp script --zygote`, its fd 0 the control socket, outside
/// every sandbox, with the engine's base environment. Its own `HOME` is the runners'
/// directory: nothing of the host user's (`~/.local`) reaches the interpreter its
/// children share.
fn start(
    interp: &Path,
    script: &Path,
    base_env: &std::collections::BTreeMap<String, String>,
) -> std::io::Result<Live> {
    let (ours, theirs) = sys::seqpacket_pair()?;
    let null = || -> std::io::Result<OwnedFd> { Ok(std::fs::File::open("/dev/null")?.into()) };
    let path = sys::cstring(interp.as_os_str().as_encoded_bytes())?;
    let dir = script.parent().unwrap_or(Path::new("/"));
    let mut vars = base_env.clone();
    for key in ["HOME", "PWD"] {
        vars.insert(key.into(), dir.to_string_lossy().into_owned());
    }
    let env = vars
        .iter()
        .map(|(k, v)| sys::cstring(format!("{k}={v}")))
        .collect::<std::io::Result<Vec<CString>>>()?;
    let spec = SpawnSpec {
        path: path.clone(),
        argv: vec![
            path,
            sys::cstring(script.as_os_str().as_encoded_bytes())?,
            sys::cstring("--zygote")?,
        ],
        env,
        cwd: sys::cstring(dir.as_os_str().as_encoded_bytes())?,
        stdio: [theirs, null()?, null()?],
        fd3: None,
        rlimits: vec![(libc::RLIMIT_CORE, 0, 0)],
        cgroup_procs: Vec::new(),
        netns: None,
        mntns: None,
        controlling_tty: false,
    };
    let child = spawn(&spec).map_err(|e| {
        std::io::Error::new(
            e.error.kind(),
            format!(
                "starting the Python fork server: {} failed: {}",
                e.stage.map_or("starting it", |s| s.describe()),
                e.error
            ),
        )
    })?;
    drop(spec);
    Ok(Live {
        interp: interp.to_path_buf(),
        script: script.to_path_buf(),
        sock: ours,
        child,
    })
}

/// Sends one request and reads its answer: the child's pidfd.
fn ask(z: &Live, message: &[u8], fds: &[OwnedFd]) -> Result<OwnedFd, Fault> {
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
    sys::send_with_fds(&z.sock, message, &borrowed).map_err(Fault::Broken)?;
    let mut poll = [libc::pollfd {
        fd: z.sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let ready =
        sys::poll(&mut poll, ANSWER_WITHIN.as_millis() as libc::c_int).map_err(Fault::Broken)?;
    if ready == 0 {
        return Err(Fault::Broken(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the Python fork server did not answer within {ANSWER_WITHIN:?}"),
        )));
    }
    let mut buf = vec![0u8; 4096];
    let (n, mut passed) = sys::recv_with_fds(&z.sock, &mut buf).map_err(Fault::Broken)?;
    if n == 0 {
        return Err(Fault::Broken(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the Python fork server exited",
        )));
    }
    let answer: serde_json::Value = serde_json::from_slice(&buf[..n]).map_err(|e| {
        Fault::Broken(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the Python fork server's answer does not parse: {e}"),
        ))
    })?;
    if let Some(error) = answer.get("error").and_then(|e| e.as_str()) {
        return Err(Fault::Refused(std::io::Error::other(format!(
            "the Python fork server refused: {error}"
        ))));
    }
    match (answer.get("pid"), passed.len()) {
        (Some(_), 1) => Ok(passed.remove(0)),
        _ => Err(Fault::Broken(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the Python fork server answered {answer} with {} descriptors",
                passed.len()
            ),
        ))),
    }
}
