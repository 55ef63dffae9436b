# Paddock's host of the JavaScript runner: starts `node -e RUNNER` with the code's
# stdout and stderr on pipes of its own, and speaks the Python runner's protocol on
# its own stdin and stdout: requests are passed to node on a descriptor of their own,
# node's answers come back on another, and the code's output as "out" lines, all of it
# before the turn's "end".
import codecs
import json
import os
import subprocess
import sys
import threading

runner = sys.argv[1]
proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
lock = threading.Lock()


def send(obj):
    with lock:
        proto.write(json.dumps(obj, ensure_ascii=False) + "\n")
        proto.flush()


req_r, req_w = os.pipe()
ans_r, ans_w = os.pipe()
out_r, out_w = os.pipe()
err_r, err_w = os.pipe()
env = dict(os.environ, PADDOCK_REQ_FD=str(req_r), PADDOCK_PROTO_FD=str(ans_w))
node = subprocess.Popen(
    ["node", "-e", runner],
    stdin=subprocess.DEVNULL,
    stdout=out_w,
    stderr=err_w,
    pass_fds=(req_r, ans_w),
    env=env,
)
os.close(req_r)
os.close(ans_w)


class Pump(threading.Thread):
    def __init__(self, fd, stream):
        super().__init__(daemon=True)
        self.fd, self.stream = fd, stream
        self.mark, self.seen = None, threading.Event()

    def run(self):
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        pending = b""
        while True:
            data = os.read(self.fd, 65536)
            if not data:
                return
            pending += data
            mark = self.mark
            if mark is not None and mark in pending:
                before, _, pending = pending.partition(mark)
                text = dec.decode(before, final=True)
                if text:
                    send({"type": "out", "stream": self.stream, "text": text})
                self.seen.set()
                continue
            keep = len(mark) - 1 if mark is not None else 0
            if not keep:
                out, pending = pending, b""
            elif len(pending) > keep:
                out, pending = pending[:-keep], pending[-keep:]
            else:
                out = b""
            text = dec.decode(out)
            if text:
                send({"type": "out", "stream": self.stream, "text": text})


pumps = [(Pump(out_r, "stdout"), out_w), (Pump(err_r, "stderr"), err_w)]
for p, _ in pumps:
    p.start()


def answers():
    buf = b""
    while True:
        data = os.read(ans_r, 65536)
        if not data:
            os._exit(1)
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("type") == "end":
                # Whatever node wrote before its end is in the pipes ahead of a mark
                # written now: it goes out first.
                mark = ("\x00paddock-turn-%s\x00" % msg.get("n")).encode()
                for p, w in pumps:
                    p.seen.clear()
                    p.mark = mark
                    os.write(w, mark)
                for p, _ in pumps:
                    p.seen.wait(10)
                    p.mark = None
            send(msg)


threading.Thread(target=answers, daemon=True).start()
try:
    for line in sys.stdin.buffer:
        os.write(req_w, line)
finally:
    node.kill()
