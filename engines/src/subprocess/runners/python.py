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

FRAMES = os.fdopen(3, "w", buffering=1, encoding="utf-8", newline="\n")
_current = {"id": None}


def send(frame):
    frame = dict({"v": 1}, **frame)
    line = json.dumps(frame, separators=(",", ":"), ensure_ascii=False, default=str)
    FRAMES.write(line + "\n")
    FRAMES.flush()


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


if __name__ == "__main__":
    main()
