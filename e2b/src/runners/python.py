# Paddock's code-interpreter runner for Python: one persistent namespace per process.
#
# Requests arrive on stdin, one JSON object per line: {"code": str, "env": {…}|null,
# "n": int}. Answers go to the original stdout, one JSON object per line: "out"
# (stream, text), "result" (the last expression's value, with its rich reprs),
# "error" (name, value, traceback), then "end" (n, count). The program's own fds 1
# and 2 are pipes this runner reads, so output of the code (and of its children)
# comes back as "out" lines and never mixes with the answers.
import ast
import base64
import codecs
import json
import os
import signal
import sys
import threading
import traceback

_proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
# Requests come on a private copy of stdin; the code's own stdin reads as empty.
_requests = os.fdopen(os.dup(0), "r", encoding="utf-8", errors="replace")
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdin = open(os.devnull, "r")
_lock = threading.Lock()


def _send(obj):
    line = json.dumps(obj, ensure_ascii=False)
    with _lock:
        _proto.write(line + "\n")
        _proto.flush()


class _Pump(threading.Thread):
    """Forwards what is written to fd `fd` as "out" lines; `mark` bytes end a turn."""

    def __init__(self, fd, stream):
        super().__init__(daemon=True)
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        self.r, self.stream = r, stream
        self.mark = None
        self.seen = threading.Event()

    def run(self):
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        pending = b""
        while True:
            data = os.read(self.r, 65536)
            if not data:
                return
            pending += data
            mark = self.mark
            if mark is not None and mark in pending:
                before, _, pending = pending.partition(mark)
                text = dec.decode(before, final=True)
                if text:
                    _send({"type": "out", "stream": self.stream, "text": text})
                self.seen.set()
                continue
            # Keep what could be the start of a mark for the next read.
            keep = len(mark) - 1 if mark is not None else 0
            if not keep:
                out, pending = pending, b""
            elif len(pending) > keep:
                out, pending = pending[:-keep], pending[-keep:]
            else:
                out = b""
            text = dec.decode(out)
            if text:
                _send({"type": "out", "stream": self.stream, "text": text})


_out = _Pump(1, "stdout")
_err = _Pump(2, "stderr")
_out.start()
_err.start()
sys.stdout = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
sys.stderr = os.fdopen(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)

_REPRS = [
    ("html", "_repr_html_"),
    ("markdown", "_repr_markdown_"),
    ("svg", "_repr_svg_"),
    ("png", "_repr_png_"),
    ("jpeg", "_repr_jpeg_"),
    ("pdf", "_repr_pdf_"),
    ("latex", "_repr_latex_"),
    ("json", "_repr_json_"),
    ("javascript", "_repr_javascript_"),
]


def _result(value):
    out = {"type": "result", "is_main_result": True}
    try:
        out["text"] = repr(value)
    except Exception as e:  # a repr that raises still gives a result
        out["text"] = f"<repr failed: {e!r}>"
    for key, method in _REPRS:
        f = getattr(value, method, None)
        if not callable(f):
            continue
        try:
            v = f()
        except Exception:
            continue
        if v is None:
            continue
        if isinstance(v, tuple):  # (data, metadata)
            v = v[0]
        if isinstance(v, (bytes, bytearray)):
            v = base64.b64encode(bytes(v)).decode("ascii")
        out[key] = v
    return out


_ns = {"__name__": "__main__", "__builtins__": __builtins__}
_count = 0


def _run(code):
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), _ns)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), _ns)
        if value is not None:
            _ns["_"] = value
            return value
    return None


def _turn(req):
    global _count
    _count += 1
    env = req.get("env") or {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({str(k): str(v) for k, v in env.items()})
    value, error = None, None
    try:
        # An interrupt (the server's SIGINT when the caller left) is a
        # KeyboardInterrupt in the code, and only there: between turns it does
        # nothing (a handler, not SIG_IGN, so that programs started meanwhile do
        # not inherit an ignored SIGINT).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        value = _run(req.get("code", ""))
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: the context lives on
        # The traceback from the cell's own frames on (none for a syntax error).
        t = e.__traceback__
        while t is not None and t.tb_frame.f_code.co_filename != "<cell>":
            t = t.tb_next
        tb = "".join(traceback.format_exception(type(e), e, t))
        error = {"type": "error", "name": type(e).__name__, "value": str(e), "traceback": tb}
    finally:
        signal.signal(signal.SIGINT, _between_turns)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    # Everything the code wrote goes out before its result and its end.
    mark = ("\x00paddock-turn-%d\x00" % _count).encode()
    for pump, stream in ((_out, sys.stdout), (_err, sys.stderr)):
        pump.seen.clear()
        pump.mark = mark
        stream.flush()
        os.write(1 if pump is _out else 2, mark)
    for pump in (_out, _err):
        pump.seen.wait(10)
        pump.mark = None
    if error is not None:
        _send(error)
    elif value is not None:
        _send(_result(value))
    _send({"type": "end", "n": req.get("n"), "count": _count})


def _between_turns(_signum, _frame):
    pass


signal.signal(signal.SIGINT, _between_turns)
_send({"type": "ready"})
for _line in _requests:
    try:
        _req = json.loads(_line)
    except ValueError:
        continue
    try:
        _turn(_req)
    except KeyboardInterrupt:
        # An interrupt that came as the turn was ending, outside the code: the turn
        # is over all the same (a second end of the same turn is ignored).
        signal.signal(signal.SIGINT, _between_turns)
        _send({"type": "end", "n": _req.get("n"), "count": _count})
