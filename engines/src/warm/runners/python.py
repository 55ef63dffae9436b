"""Paddock's warm Python runner: json-stdio v1 on fd 0 (frames in) and fd 3 (frames
out). The snippet's own stdout and stderr stay on fd 1 and 2, which the host captures
as they are, so nothing a snippet prints can be mistaken for a frame.

invoke input: {"code": "<source>"} runs a snippet in a fresh namespace; its value is the
value of its last expression (as in a notebook cell; none when that is None). {"handler": "module:function",
"input": <json>} calls a function: `module` is a path to a .py file relative to the
working directory, or an importable module name.

The turn ends like a process would: an `output` frame whose output is
{"exit_code": 0, "value": <json>} on success, {"exit_code": 1} after an uncaught
exception (its traceback on stderr), {"exit_code": n} after sys.exit(n). A value JSON
cannot hold comes back as its repr().

The host cancels a turn by writing a `cancel` frame and sending the runner SIGINT,
which interrupts the snippet (KeyboardInterrupt); the turn then ends with an error
frame of code CANCELLED, and the host kills the runner if it has not ended the turn
within a short grace period. Closing stdin shuts the runner down.
"""

import ast
import importlib
import importlib.util
import json
import os
import sys

_current = {"id": None}
# The frames out, on fd 3: opened by main(), not at import (a zygote has no fd 3).
_frames = []


def send(frame):
    frame = dict({"v": 1}, **frame)
    line = json.dumps(frame, separators=(",", ":"), ensure_ascii=False, default=str)
    if not _frames:
        _frames.append(os.fdopen(3, "w", buffering=1, encoding="utf-8", newline="\n"))
    _frames[0].write(line + "\n")
    _frames[0].flush()


def flush_std():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def to_json(value):
    try:
        text = json.dumps(value, allow_nan=False)
        return json.loads(text)
    except (TypeError, ValueError, OverflowError):
        return repr(value)


def run_code(source):
    tree = ast.parse(source, "<snippet>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(tree, "<snippet>", "exec"), namespace)
    if last is not None:
        return eval(compile(last, "<snippet>", "eval"), namespace)
    return None


_handlers = {}


def run_handler(spec, value):
    module_name, _, function = spec.partition(":")
    if not module_name or not function:
        raise ValueError("handler must be `module:function`, for example `tools/sum.py:main`")
    key = (module_name, function)
    fn = _handlers.get(key)
    if fn is None:
        if module_name.endswith(".py"):
            path = os.path.abspath(module_name)
            spec_ = importlib.util.spec_from_file_location("paddock_handler_%d" % len(_handlers), path)
            if spec_ is None or spec_.loader is None:
                raise ImportError("cannot load %s" % module_name)
            module = importlib.util.module_from_spec(spec_)
            spec_.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        fn = getattr(module, function)
        _handlers[key] = fn
    return fn(value)


def print_exception(exc):
    """The traceback as `python3 -c` prints it, without the runner's own frames."""
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        sys.stderr.write(text)
    except Exception:
        pass


def handle(frame):
    job = frame["id"]
    payload = frame.get("input") or {}
    _current["id"] = job
    try:
        output = {"exit_code": 0}
        if isinstance(payload, dict) and "code" in payload:
            value = run_code(payload["code"])
            # As in a notebook cell, a snippet whose last expression is None (a
            # print(), say) has no value.
            if value is not None:
                output["value"] = to_json(value)
        elif isinstance(payload, dict) and "handler" in payload:
            output["value"] = to_json(run_handler(payload["handler"], payload.get("input")))
        else:
            raise ValueError("input must hold `code` or `handler`")
        reply = {"kind": "output", "id": job, "output": output}
    except KeyboardInterrupt:
        # SIGINT is how the host cancels a turn.
        reply = {"kind": "error", "id": job, "error": {"code": "CANCELLED", "message": "cancelled"}}
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            sys.stderr.write("%s\n" % (exc.code,))
            code = 1
        reply = {"kind": "output", "id": job, "output": {"exit_code": code & 0xFF}}
    except BaseException as exc:
        print_exception(exc)
        reply = {"kind": "output", "id": job, "output": {"exit_code": 1}}
    finally:
        _current["id"] = None
    flush_std()
    send(reply)


def main():
    """Reads frames one line at a time and serves each invoke. A cancel for the turn
    in progress arrives as SIGINT (the host signals the runner after writing the
    `cancel` frame), which Python raises as KeyboardInterrupt in the snippet; `cancel`
    frames read between turns have no turn to stop and are dropped."""
    # Line-buffered output: a snippet's lines stream as they are printed, one write
    # each (unbuffered output would cost a write, and a wake-up of the host, per
    # print argument).
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    frames_in = os.fdopen(0, "r", encoding="utf-8", newline="\n")
    while True:
        try:
            line = frames_in.readline()
        except KeyboardInterrupt:
            # A cancel that arrived after its turn ended.
            continue
        if not line:
            return
        if not line.strip():
            continue
        try:
            frame = json.loads(line)
        except ValueError:
            sys.stderr.write("paddock runner: unreadable frame\n")
            os._exit(3)
        if frame.get("v") != 1:
            sys.stderr.write("paddock runner: unsupported protocol version\n")
            os._exit(3)
        kind = frame.get("kind")
        if kind == "cancel":
            continue
        if kind != "invoke":
            send({"kind": "error", "id": frame.get("id", "?"),
                  "error": {"code": "PROTOCOL_ERROR", "message": "this runner takes invoke and cancel frames"}})
            continue
        try:
            handle(frame)
        except KeyboardInterrupt:
            # Interrupted after the turn's frame was written.
            pass


# --- Zygote mode -------------------------------------------------------------------
#
# `python3 python.py --zygote` is a fork server: an interpreter with this runner
# loaded, started once per engine outside every sandbox, which never runs a snippet.
# For each request it forks a child, which joins the sandbox (its cgroups, network and
# mount namespaces, rlimits, stdio, working directory and environment), closes
# every other descriptor, and only then serves frames as a runner started for the
# sandbox would. The host's socket is fd 0 (SOCK_SEQPACKET); a request is one
# message of JSON with descriptors attached:
#   {"fds": ["stdin", "stdout", "stderr", "frames", "netns"?, "mntns"?, "cgroup"*],
#    "cwd": "...", "env": {...}, "rlimits": [[resource, soft, hard], ...]}
# and the answer is {"pid": n} with the child's pidfd attached, or {"error": "..."}.
# Children are reaped here; the host watches and signals them through their pidfds.

_ZYGOTE_SETUP_FAILED = 121


def _enter(fd, nstype):
    setns = getattr(os, "setns", None)
    if setns is not None:
        setns(fd, nstype)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _become(request, fds, script):
    """In the forked child: join the sandbox, then serve as its runner. Never returns."""
    import resource
    import signal

    stage = "starting"
    # Setup errors go to the runner's stderr pipe once it came (the server's is
    # /dev/null).
    err_fd = 2
    try:
        stage = "resetting signals"
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        stage = "starting a new session"
        os.setsid()
        roles = request["fds"]
        # The highest descriptor this process holds, read before any namespace
        # changes (a mount namespace may show another /proc).
        top = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        by_role = {}
        for role, fd in zip(roles, fds):
            if role == "cgroup":
                stage = "joining the sandbox cgroup"
                os.write(fd, b"0")
                os.close(fd)
            else:
                by_role[role] = fd
        err_fd = by_role.get("stderr", 2)
        if "netns" in by_role:
            stage = "entering the sandbox's network namespace"
            _enter(by_role.pop("netns"), 0x40000000)  # CLONE_NEWNET
        if "mntns" in by_role:
            stage = "entering the sandbox's mount namespace"
            _enter(by_role.pop("mntns"), 0x00020000)  # CLONE_NEWNS
        stage = "wiring stdin/stdout/stderr"
        # Above every target first, so that no dup2 overwrites a source.
        high = [os.dup(by_role[r]) for r in ("stdin", "stdout", "stderr", "frames")]
        for target, fd in enumerate(high):
            os.dup2(fd, target, inheritable=True)
        # Every other descriptor goes: the server's socket, what was passed, the
        # copies above (above `top` by at most four).
        os.closerange(4, top + 5)
        stage = "changing to the working directory"
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [script]
        # Last: an open-files limit below the numbers used above must not stop them.
        stage = "setting resource limits"
        for res, soft, hard in request.get("rlimits", []):
            resource.setrlimit(res, (soft, hard))
    except BaseException as exc:
        try:
            os.write(err_fd, ("paddock zygote: %s failed: %s\n" % (stage, exc)).encode())
        finally:
            os._exit(_ZYGOTE_SETUP_FAILED)
    try:
        main()
    finally:
        flush_std()
        os._exit(0)


def _reap():
    """Reaps the runners that ended, each after killing what is left of its session
    (the runner led it, and its pid, held until the reap, names it)."""
    import signal

    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == 0:
            return
        try:
            os.killpg(info.si_pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            pass


def zygote(script):
    import gc
    import signal
    import socket
    import traceback  # noqa: F401  (loaded here, shared by every child)

    if not hasattr(os, "pidfd_open") or not hasattr(socket, "recv_fds"):
        sys.stderr.write("paddock zygote: this Python has no os.pidfd_open or socket.recv_fds (3.9+)\n")
        sys.exit(3)
    ctl = socket.socket(fileno=0)
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    # What no tenant touched, kept out of the collector's way so that the children
    # share it copy-on-write for as long as they leave it alone.
    gc.freeze()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 64)
        except InterruptedError:
            continue
        if not message:
            return
        try:
            request = json.loads(message)
            if len(request.get("fds", ())) != len(fds):
                raise ValueError("the request names %d descriptors and brought %d"
                                 % (len(request.get("fds", ())), len(fds)))
            for role in ("stdin", "stdout", "stderr", "frames"):
                if role not in request["fds"]:
                    raise ValueError("the request brought no %s" % role)
        except (ValueError, TypeError, AttributeError) as exc:
            for fd in fds:
                os.close(fd)
            ctl.send(json.dumps({"error": "bad request: %s" % exc}).encode())
            continue
        # SIGCHLD waits until the child's pidfd is open: it names this child, not
        # a reaped pid's successor.
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
        try:
            pid = os.fork()
            if pid == 0:
                ctl.detach()
                _become(request, fds, script)
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                # Not reaped yet (SIGCHLD waits): the pid is still this child's.
                os.kill(pid, signal.SIGKILL)
                raise
        except OSError as exc:
            answer, pidfd = {"error": "fork failed: %s" % exc}, None
        else:
            answer = {"pid": pid}
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        for fd in fds:
            os.close(fd)
        if pidfd is None:
            ctl.send(json.dumps(answer).encode())
        else:
            socket.send_fds(ctl, [json.dumps(answer).encode()], [pidfd])
            os.close(pidfd)
        _reap()


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        zygote(sys.argv[0])
    else:
        main()
