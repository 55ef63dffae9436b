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

    let mut pidfd: libc::c_int = -1;
    // SAFETY: CLONE_VM | CLONE_VFORK suspends this thread until the child execs or
    // exits, so `ctx`, the pointer arrays and `stack` outlive every access the child
    // makes. `child_main` only makes async-signal-safe system calls and never
    // returns into Rust code that could unwind or allocate.
    let pid = unsafe {
        libc::clone(
            child_main,
            stack_top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            &ctx as *const ChildCtx as *mut libc::c_void,
            &mut pidfd as *mut libc::c_int,
        )
    };
    let clone_err = io::Error::last_os_error();
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

/// Makes `cmd`'s child start a new session (so it leads its own process group) and,
/// with `controlling_tty`, take the terminal on its stdin as its controlling
/// terminal, before it executes the program. For programs started with
/// `std::process::Command` (the container agent's background processes).
pub(crate) fn in_new_session(cmd: &mut std::process::Command, controlling_tty: bool) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe calls (setsid, ioctl); it neither allocates nor locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            if controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
