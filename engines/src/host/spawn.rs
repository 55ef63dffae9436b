//! Starting a program without forking the host.
//!
//! A `fork` copies the parent's page tables, so its cost grows with the host's memory:
//! 10 ms at 256 MiB, 80 ms at 2 GiB on the machines Paddock targets. `posix_spawn`
//! avoids that with `CLONE_VM | CLONE_VFORK`, but it cannot join a cgroup, enter a
//! network namespace or set rlimits for the child. This module does what
//! `posix_spawn` does, plus those steps: the child shares the parent's memory until
//! it calls `execve`, runs only async-signal-safe system calls on its own small stack,
//! and reports a failure through memory the parent reads after `clone` returns (the
//! parent is suspended until the child has exec'd or exited).
//!
//! The child, in order: resets every signal disposition to default, starts a new
//! session (so it leads its own process group), joins the given cgroups, enters the
//! network namespace, applies rlimits, wires stdio (and fd 3 when asked; stdin as the
//! controlling terminal when asked), marks every other fd
//! close-on-exec, changes directory, unblocks signals and `execve`s.

// `clone`, the child's system calls on its own stack and `pre_exec` are `unsafe`;
// this module is where the crate starts programs, so it is where they are.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// Everything the child needs, prepared by the parent (the child must not allocate).
#[derive(Debug)]
pub(crate) struct SpawnSpec {
    /// Absolute path of the program.
    pub(crate) path: CString,
    /// argv.
    pub(crate) argv: Vec<CString>,
    /// `KEY=VALUE` environment entries.
    pub(crate) env: Vec<CString>,
    /// Working directory.
    pub(crate) cwd: CString,
    /// stdin, stdout and stderr for the child.
    pub(crate) stdio: [OwnedFd; 3],
    /// A further descriptor the child gets as fd 3 (a warm runner's frame channel).
    pub(crate) fd3: Option<OwnedFd>,
    /// rlimits to set: (resource, soft, hard).
    pub(crate) rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// `cgroup.procs` files to join (writing "0" moves the writer).
    pub(crate) cgroup_procs: Vec<CString>,
    /// A network namespace to enter.
    pub(crate) netns: Option<RawFd>,
    /// A mount namespace to enter (the container engine runs crun in one).
    pub(crate) mntns: Option<RawFd>,
    /// Whether stdin is a terminal that becomes the child's controlling terminal.
    pub(crate) controlling_tty: bool,
}

impl SpawnSpec {
    /// Copies of the network and mount namespaces the spec names (it only borrows
    /// them from the sandbox), for a child started elsewhere than here.
    pub(crate) fn namespace_copies(&self) -> io::Result<(Option<OwnedFd>, Option<OwnedFd>)> {
        let copy = |fd: Option<RawFd>| -> io::Result<Option<OwnedFd>> {
            fd.map(|fd| {
                // SAFETY: the spec's owner holds the descriptor open while the spec
                // lives; the copy is ours.
                unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()
            })
            .transpose()
        };
        Ok((copy(self.netns)?, copy(self.mntns)?))
    }
}

/// A started child: its pid (also its process group and session id) and a pidfd.
#[derive(Debug)]
pub(crate) struct SpawnedChild {
    pub(crate) pid: libc::pid_t,
    pub(crate) pidfd: OwnedFd,
}

/// The step at which the child failed, reported back with errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpawnStage {
    Setsid = 1,
    Cgroup,
    Netns,
    Rlimit,
    Stdio,
    Chdir,
    Exec,
    Mntns,
    /// The child did not reach `execve` in [`START_LIMIT`] and was killed.
    Stalled,
}

impl SpawnStage {
    fn from_i32(v: i32) -> Option<SpawnStage> {
        Some(match v {
            1 => SpawnStage::Setsid,
            2 => SpawnStage::Cgroup,
            3 => SpawnStage::Netns,
            4 => SpawnStage::Rlimit,
            5 => SpawnStage::Stdio,
            6 => SpawnStage::Chdir,
            7 => SpawnStage::Exec,
            8 => SpawnStage::Mntns,
            9 => SpawnStage::Stalled,
            _ => return None,
        })
    }

    /// What the stage does, for error messages.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            SpawnStage::Setsid => "starting a new session",
            SpawnStage::Cgroup => "joining the sandbox cgroup",
            SpawnStage::Netns => "entering the empty network namespace",
            SpawnStage::Rlimit => "setting resource limits",
            SpawnStage::Stdio => "wiring stdin/stdout/stderr",
            SpawnStage::Chdir => "changing to the working directory",
            SpawnStage::Exec => "executing the program",
            SpawnStage::Mntns => "entering the runtime's mount namespace",
            SpawnStage::Stalled => {
                "starting the program (it did not reach exec in time and was killed: the \
                 sandbox's memory or CPU limits, or what already runs in it, leave it no room)"
            }
        }
    }
}

/// A failed spawn: the stage and the OS error.
#[derive(Debug)]
pub(crate) struct SpawnError {
    pub(crate) stage: Option<SpawnStage>,
    pub(crate) error: io::Error,
}

/// Raw, NUL-terminated pointer arrays and report slots, shared with the child.
struct ChildCtx {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    /// The descriptors the child gets as fd 0, 1, 2 and (when `fds` is 4) 3.
    stdio: [RawFd; 4],
    fds: usize,
    rlimits: *const (libc::__rlimit_resource_t, u64, u64),
    rlimits_len: usize,
    cgroups: *const *const libc::c_char,
    cgroups_len: usize,
    netns: RawFd,
    mntns: RawFd,
    controlling_tty: bool,
    fail_stage: AtomicI32,
    fail_errno: AtomicI32,
}

const STACK_SIZE: usize = 64 * 1024;

/// How long a child may take from `clone` to `execve` before it is killed.
///
/// Until it execs, the child shares the host's memory and the host's thread waits
/// for it (`CLONE_VFORK`). Once it joined the sandbox's cgroups it is throttled and
/// reclaimed like the sandbox's own processes: in a sandbox at its memory limit it
/// can stall for as long as the sandbox stays there, and the host's thread (an
/// actor's) with it. A watchdog thread kills a child that has not exec'd by then,
/// so that the spawn fails instead of hanging.
pub(crate) const START_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A spawn in progress, as the watchdog sees it.
struct Starting {
    /// The child's pidfd, written by the kernel during `clone` (-1 until then).
    pidfd: AtomicI32,
    since: std::time::Instant,
    killed: std::sync::atomic::AtomicBool,
}

/// The spawns in progress.
static STARTING: parking_lot::Mutex<Vec<std::sync::Arc<Starting>>> =
    parking_lot::Mutex::new(Vec::new());

/// Starts the watchdog thread once.
fn watchdog() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let started = std::thread::Builder::new()
            .name("paddock-spawn-watch".into())
            .spawn(|| loop {
                std::thread::sleep(std::time::Duration::from_millis(500));
                let starting = STARTING.lock();
                for s in starting.iter() {
                    let fd = s.pidfd.load(Ordering::Acquire);
                    if fd >= 0
                        && s.since.elapsed() >= START_LIMIT
                        && !s.killed.load(Ordering::Acquire)
                    {
                        // SAFETY: a plain system call on a number. The spawning
                        // thread takes the entry out (under this lock) before it
                        // owns the fd, so the number is not reused meanwhile; the
                        // kernel writes it before the fd is installed, so the call
                        // may find no fd (EBADF) and is then tried again next round.
                        let sent = unsafe {
                            libc::syscall(
                                libc::SYS_pidfd_send_signal,
                                fd,
                                libc::SIGKILL,
                                std::ptr::null::<libc::siginfo_t>(),
                                0,
                            )
                        };
                        if sent == 0 {
                            s.killed.store(true, Ordering::Release);
                            // The kill lands when the child runs next: out of the
                            // sandbox's limits, so that it does run.
                            if let Some(pid) = pidfd_pid(fd) {
                                crate::host::cgroup::return_to_own_groups(pid);
                            }
                        }
                    }
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "the spawn watchdog could not start; a child that stalls before exec is not killed");
        }
    });
}

/// The pid a pidfd of this process refers to (`/proc/self/fdinfo`).
pub(crate) fn pidfd_pid(fd: RawFd) -> Option<libc::pid_t> {
    let info = crate::host::sys::read_small(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse().ok())
        .filter(|pid: &libc::pid_t| *pid > 0)
}

/// Starts the program described by `spec`.
pub(crate) fn spawn(spec: &SpawnSpec) -> Result<SpawnedChild, SpawnError> {
    let mut argv: Vec<*const libc::c_char> = spec.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = spec.env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let cgroups: Vec<*const libc::c_char> = spec.cgroup_procs.iter().map(|c| c.as_ptr()).collect();

    let ctx = ChildCtx {
        path: spec.path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: spec.cwd.as_ptr(),
        stdio: [
            spec.stdio[0].as_raw_fd(),
            spec.stdio[1].as_raw_fd(),
            spec.stdio[2].as_raw_fd(),
            spec.fd3.as_ref().map_or(-1, |f| f.as_raw_fd()),
        ],
        fds: if spec.fd3.is_some() { 4 } else { 3 },
        rlimits: spec.rlimits.as_ptr(),
        rlimits_len: spec.rlimits.len(),
        cgroups: cgroups.as_ptr(),
        cgroups_len: cgroups.len(),
        netns: spec.netns.unwrap_or(-1),
        mntns: spec.mntns.unwrap_or(-1),
        controlling_tty: spec.controlling_tty,
        fail_stage: AtomicI32::new(0),
        fail_errno: AtomicI32::new(0),
    };

    // The child's stack; u128 elements keep it 16-byte aligned.
    let mut stack = vec![0u128; STACK_SIZE / 16];
    // SAFETY: one past the end of the allocation; the stack grows down from here.
    let stack_top = unsafe { stack.as_mut_ptr().add(stack.len()) } as *mut libc::c_void;

    // Block every signal so no handler of the host runs on the child's stack while
    // it shares our memory; the child unblocks after resetting dispositions.
    // SAFETY: sigset_t is plain data; the calls only read/write these locals.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }

    watchdog();
    let watch = std::sync::Arc::new(Starting {
        pidfd: AtomicI32::new(-1),
        since: std::time::Instant::now(),
        killed: std::sync::atomic::AtomicBool::new(false),
    });
    STARTING.lock().push(watch.clone());
    // SAFETY: CLONE_VM | CLONE_VFORK suspends this thread until the child execs or
    // exits, so `ctx`, the pointer arrays and `stack` outlive every access the child
    // makes. `child_main` only makes async-signal-safe system calls and never
    // returns into Rust code that could unwind or allocate. The kernel writes the
    // pidfd into the watch's atomic (an `i32` in memory), which the watchdog reads.
    let pid = unsafe {
        libc::clone(
            child_main,
            stack_top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            &ctx as *const ChildCtx as *mut libc::c_void,
            watch.pidfd.as_ptr(),
        )
    };
    let clone_err = io::Error::last_os_error();
    // Out of the watchdog's sight before the fd is owned here.
    STARTING
        .lock()
        .retain(|s| !std::sync::Arc::ptr_eq(s, &watch));
    let pidfd = watch.pidfd.load(Ordering::Acquire);
    let stalled = watch.killed.load(Ordering::Acquire);
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(stack);

    if pid == -1 {
        return Err(SpawnError {
            stage: None,
            error: clone_err,
        });
    }
    // SAFETY: CLONE_PIDFD stored a new fd that nobody else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };

    if stalled && ctx.fail_stage.load(Ordering::Acquire) == 0 {
        // Killed before it exec'd (or in the moment it did): killed again through
        // the fd now owned here, with its group (what it may have started in that
        // moment), so that the reap cannot wait on a live program.
        // SAFETY: a plain system call; the group is the child's own (setsid).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = crate::host::sys::pidfd_send_signal(&pidfd, libc::SIGKILL);
        let _ = crate::host::sys::reap(pid);
        return Err(SpawnError {
            stage: Some(SpawnStage::Stalled),
            error: io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no exec within {} s", START_LIMIT.as_secs()),
            ),
        });
    }
    let stage = ctx.fail_stage.load(Ordering::Acquire);
    if stage != 0 {
        let errno = ctx.fail_errno.load(Ordering::Acquire);
        // The child has exited; reap it so it does not linger as a zombie.
        let _ = crate::host::sys::reap(pid);
        return Err(SpawnError {
            stage: SpawnStage::from_i32(stage),
            error: io::Error::from_raw_os_error(errno),
        });
    }
    Ok(SpawnedChild { pid, pidfd })
}

/// [`spawn`] on a thread of the runtime's blocking pool; `spec` is dropped there
/// once the child has exec'd, so the caller's copies of the child's ends are gone
/// when this returns.
///
/// Engine methods run on the actor thread that every sandbox of the node shares.
/// `spawn` suspends its thread until the child execs, and a child in a sandbox at
/// its memory or CPU limit can take until [`START_LIMIT`] to get there: on the actor
/// thread that would stall every other request meanwhile.
///
/// A caller that stops waiting (its future dropped) leaves no program behind: the
/// child's process group is killed and reaped on that thread.
pub(crate) async fn spawn_async(mut spec: SpawnSpec) -> Result<SpawnedChild, SpawnError> {
    // The namespaces the spec names are borrowed from the sandbox; the spawning
    // thread may outlive a caller that stops waiting (and the sandbox with it), so
    // it holds copies of its own, or the child could enter whatever namespace (of
    // another sandbox) reused the number.
    let mut held = Vec::new();
    for fd in [&mut spec.netns, &mut spec.mntns].into_iter().flatten() {
        // SAFETY: the caller holds the descriptor open for the call (the spec borrows
        // it); the copy is owned here.
        let copy = unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) }
            .try_clone_to_owned()
            .map_err(|error| SpawnError { stage: None, error })?;
        *fd = copy.as_raw_fd();
        held.push(copy);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::task::spawn_blocking(move || {
        let child = spawn(&spec).map(|c| Delivered(Some(c)));
        drop(spec);
        drop(held);
        // A caller that is gone drops the answer, and with it the child.
        let _ = tx.send(child);
    });
    drop(task);
    match rx.await {
        Ok(Ok(mut delivered)) => Ok(delivered.0.take().expect("delivered once")),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(SpawnError {
            stage: None,
            error: io::Error::other("the spawning thread ended without an answer"),
        }),
    }
}

/// A started child on its way to the caller of [`spawn_async`]: killed and reaped
/// (off the dropping thread) if nobody takes it.
struct Delivered(Option<SpawnedChild>);

impl Drop for Delivered {
    fn drop(&mut self) {
        let Some(orphan) = self.0.take() else {
            return;
        };
        // SAFETY: a plain system call; the group is the orphan's own (setsid).
        unsafe { libc::kill(-orphan.pid, libc::SIGKILL) };
        let _ = crate::host::sys::pidfd_send_signal(&orphan.pidfd, libc::SIGKILL);
        // The reap may wait for a throttled task to die: not on this thread.
        let _ = std::thread::Builder::new()
            .name("paddock-reap".into())
            .spawn(move || {
                let _ = crate::host::sys::reap(orphan.pid);
                drop(orphan);
            });
    }
}

/// The child side. Runs on the private stack, sharing the parent's memory.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildCtx` the parent keeps alive while it is suspended.
    let ctx = unsafe { &*(arg as *const ChildCtx) };
    // SAFETY: every call below is a plain system call wrapper on data the parent
    // prepared; nothing allocates, locks or unwinds.
    unsafe {
        // Default dispositions (the host may ignore SIGPIPE or have handlers that
        // must never run in the child).
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }

        if libc::setsid() == -1 {
            return fail(ctx, SpawnStage::Setsid);
        }

        for i in 0..ctx.cgroups_len {
            let path = *ctx.cgroups.add(i);
            let fd = libc::open(path, libc::O_WRONLY | libc::O_CLOEXEC);
            if fd == -1 {
                return fail(ctx, SpawnStage::Cgroup);
            }
            let ok = libc::write(fd, b"0".as_ptr() as *const libc::c_void, 1) == 1;
            if !ok {
                return fail(ctx, SpawnStage::Cgroup);
            }
            libc::close(fd);
        }

        if ctx.netns >= 0 && libc::setns(ctx.netns, libc::CLONE_NEWNET) == -1 {
            return fail(ctx, SpawnStage::Netns);
        }
        // The child has its own fs_struct (no CLONE_FS), as entering a mount
        // namespace requires.
        if ctx.mntns >= 0 && libc::setns(ctx.mntns, libc::CLONE_NEWNS) == -1 {
            return fail(ctx, SpawnStage::Mntns);
        }

        // First move every source above the targets, so that placing one cannot
        // overwrite another that happens to sit on a target number; dup2 then
        // clears close-on-exec on each target.
        let mut moved: [RawFd; 4] = [-1; 4];
        for (slot, &fd) in moved.iter_mut().zip(ctx.stdio.iter()).take(ctx.fds) {
            *slot = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 16);
            if *slot == -1 {
                return fail(ctx, SpawnStage::Stdio);
            }
        }
        for (target, &fd) in moved.iter().enumerate().take(ctx.fds) {
            if libc::dup2(fd, target as RawFd) == -1 {
                return fail(ctx, SpawnStage::Stdio);
            }
        }
        // The new session's controlling terminal: the one on stdin.
        if ctx.controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
            return fail(ctx, SpawnStage::Stdio);
        }
        // Nothing but stdio (and fd 3 when given) survives the exec, whatever the
        // host leaked. Fail closed on kernels without CLOSE_RANGE_CLOEXEC (before
        // 5.11).
        if libc::syscall(
            libc::SYS_close_range,
            ctx.fds as u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        ) == -1
        {
            return fail(ctx, SpawnStage::Stdio);
        }

        // The limits come last: until the exec the child holds every descriptor of
        // the host (close-on-exec ones included), and an `open_files` limit below
        // that count would make the moves above fail with EMFILE.
        for i in 0..ctx.rlimits_len {
            let (resource, soft, hard) = *ctx.rlimits.add(i);
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(resource, &lim) == -1 {
                return fail(ctx, SpawnStage::Rlimit);
            }
        }

        if libc::chdir(ctx.cwd) == -1 {
            return fail(ctx, SpawnStage::Chdir);
        }

        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());

        libc::execve(ctx.path, ctx.argv, ctx.envp);
        fail(ctx, SpawnStage::Exec)
    }
}

/// Records the failing stage and errno, then exits the child without running any
/// of the host's exit handlers.
fn fail(ctx: &ChildCtx, stage: SpawnStage) -> libc::c_int {
    let errno = io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO);
    ctx.fail_errno.store(errno, Ordering::Release);
    ctx.fail_stage.store(stage as i32, Ordering::Release);
    // SAFETY: _exit is async-signal-safe and never returns.
    unsafe { libc::_exit(127) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn null() -> OwnedFd {
        std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/null")
            .expect("/dev/null")
            .into()
    }

    fn spec(cgroup_procs: Vec<CString>) -> SpawnSpec {
        SpawnSpec {
            path: CString::new("/bin/true").unwrap(),
            argv: vec![CString::new("true").unwrap()],
            env: Vec::new(),
            cwd: CString::new("/").unwrap(),
            stdio: [null(), null(), null()],
            fd3: None,
            rlimits: Vec::new(),
            cgroup_procs,
            netns: None,
            mntns: None,
            controlling_tty: false,
        }
    }

    /// A child that cannot reach `execve` (it joined a frozen cgroup: as stuck as
    /// one throttled in a sandbox at its memory limit) is killed after
    /// [`START_LIMIT`], and the spawn fails with `Stalled` instead of holding its
    /// thread for ever. Needs root and a v2 hierarchy (a host without them skips).
    #[test]
    fn a_child_that_stalls_before_exec_is_killed_and_the_spawn_fails() {
        let root = match crate::host::cgroup::CgroupRoot::create() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipped: no cgroups here ({e})");
                return;
            }
        };
        let group = root
            .create_group(&format!("stall-{}", std::process::id()))
            .expect("a group");
        let Some(dir) = group.v2_dir().map(Path::to_path_buf) else {
            eprintln!("skipped: no v2 hierarchy to freeze in");
            let _ = group.remove();
            return;
        };
        // A spawn outside any group starts as usual.
        let child = spawn(&spec(Vec::new())).expect("a plain spawn");
        let _ = crate::host::sys::reap(child.pid);
        crate::host::cgroup::set_frozen_v2(&dir, true).expect("freezing the group");
        let started = std::time::Instant::now();
        let got = spawn(&spec(group.procs_files().to_vec()));
        let took = started.elapsed();
        crate::host::cgroup::set_frozen_v2(&dir, false).expect("thawing the group");
        let _ = group.kill_all();
        let _ = group.remove();
        let e = got.expect_err("a child frozen before exec does not start");
        assert_eq!(e.stage, Some(SpawnStage::Stalled), "{:?}", e.error);
        assert_eq!(e.error.kind(), io::ErrorKind::TimedOut);
        assert!(took >= START_LIMIT, "killed after {took:?}");
        assert!(took < START_LIMIT * 3, "killed only after {took:?}");
    }

    /// A spawn whose child stalls before exec waits on a blocking thread, not on the
    /// caller's: a current-thread runtime (like the actor thread every sandbox
    /// shares) keeps serving other spawns meanwhile. And the watchdog's kill lands
    /// even where SIGKILL alone cannot end the child: in a v1 freezer group a killed
    /// task stays frozen (as one in a sandbox whose CPU quota is used up is never
    /// scheduled), so the child is moved back into Paddock's own groups, where it
    /// runs and dies. Needs root and a freezer (v1 preferred; a host without one
    /// skips).
    #[test]
    fn a_stalled_spawn_holds_a_blocking_thread_only_and_its_kill_lands_in_a_frozen_v1_group() {
        let root = match crate::host::cgroup::CgroupRoot::create() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipped: no cgroups here ({e})");
                return;
            }
        };
        let group = root
            .create_group(&format!("stall-async-{}", std::process::id()))
            .expect("a group");
        let (v1, dir) = match (group.v1_freezer_dir(), group.v2_dir()) {
            (Some(d), _) => (true, d.to_path_buf()),
            (None, Some(d)) => (false, d.to_path_buf()),
            (None, None) => {
                eprintln!("skipped: no freezer to stall a child in");
                let _ = group.remove();
                return;
            }
        };
        let freeze = |frozen: bool| {
            if v1 {
                crate::host::cgroup::set_frozen(&dir, frozen)
            } else {
                crate::host::cgroup::set_frozen_v2(&dir, frozen)
            }
        };
        freeze(true).expect("freezing the group");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (stalled, took, others) = rt.block_on(async {
            let started = std::time::Instant::now();
            let stalled = tokio::spawn(spawn_async(spec(group.procs_files().to_vec())));
            // Meanwhile, on the same thread: plain spawns, one after another.
            let mut others = 0u32;
            while !stalled.is_finished() && started.elapsed() < START_LIMIT * 4 {
                let child = spawn_async(spec(Vec::new())).await.expect("a plain spawn");
                let _ = crate::host::sys::reap(child.pid);
                others += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            let took = started.elapsed();
            let landed = stalled.is_finished();
            if !landed {
                // Thawed, the killed child dies, and the spawn returns.
                let _ = freeze(false);
            }
            let got = stalled.await.expect("the spawn task");
            assert!(
                landed,
                "the kill did not land in {took:?} (v1 freezer: {v1})"
            );
            (got, took, others)
        });
        let _ = freeze(false);
        let _ = group.kill_all();
        let _ = group.remove();
        let e = stalled.expect_err("a child frozen before exec does not start");
        assert_eq!(e.stage, Some(SpawnStage::Stalled), "{:?}", e.error);
        assert!(took >= START_LIMIT, "killed after {took:?}");
        assert!(
            took < START_LIMIT * 3,
            "killed only after {took:?} (v1 freezer: {v1})"
        );
        // About one plain spawn each 100 ms for the 10 s of the stall.
        assert!(
            others >= 20,
            "only {others} other spawns ran while one stalled"
        );
    }

    /// A child nobody takes from `spawn_async` (its caller stopped waiting) is
    /// killed and reaped, not left running.
    #[test]
    fn a_child_nobody_takes_is_killed_and_reaped() {
        let mut spec = spec(Vec::new());
        spec.path = CString::new("/bin/sleep").unwrap();
        spec.argv = vec![CString::new("sleep").unwrap(), CString::new("30").unwrap()];
        let child = spawn(&spec).expect("sleep starts");
        let pid = child.pid;
        drop(Delivered(Some(child)));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        // Gone once reaped: no such process (a zombie would still answer).
        // SAFETY: signal 0 only checks that the pid exists.
        while unsafe { libc::kill(pid, 0) } == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the child {pid} still runs"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
