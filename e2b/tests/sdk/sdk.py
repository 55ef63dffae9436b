"""Paddock's E2B-compatible API, driven through E2B's own Python SDK.

Run by `e2b/tests/all/sdk.rs` against a live node (what `paddock serve --e2b`
runs), with
E2B_API_URL and E2B_SANDBOX_URL set to its URL. Every check prints `ok NAME`; the
Rust test requires every name of CHECKS. ENGINE says which engine the templates
use (pause differs), ALICE and BOB are two tenants' API keys.
"""

import datetime
import io
import json
import os
import struct
import sys
import threading
import time
import traceback

import httpx
from e2b_code_interpreter import Sandbox as CodeInterpreter
from e2b import (
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxQuery,
    TimeoutException,
)
from e2b.exceptions import InvalidArgumentException, SandboxNotRunningException

URL = os.environ.get("E2B_API_URL", "")
ENGINE = os.environ["PADDOCK_ENGINE"]
ALICE = os.environ["ALICE_KEY"]
BOB = os.environ["BOB_KEY"]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def the_issue_snippet():
    sbx = Sandbox.create(api_key=ALICE)
    try:
        r = sbx.commands.run("echo hi")
        check((r.stdout, r.exit_code) == ("hi\n", 0), f"echo: {r}")
        sbx.files.write("/home/user/a.txt", "x")
        check(sbx.files.read("/home/user/a.txt") == "x", "read back")
        h = sbx.commands.run("sleep 30", background=True)
        check(h.kill() is True, "kill answers True")
        try:
            h.wait()
            raise AssertionError("a killed command exits non-zero")
        except CommandExitException as e:
            check(e.exit_code != 0, f"killed exit code {e.exit_code}")
        # Killing the sandbox under a running command: its stream ends as E2B's does
        # when the sandbox goes, and the SDK, having asked, says it was killed.
        h = sbx.commands.run("sleep 30", background=True)
        sbx.kill()
        try:
            h.wait()
            raise AssertionError("a command of a killed sandbox ends in an exception")
        except SandboxNotRunningException as e:
            check("killed" in str(e), f"the kill named: {e}")
    finally:
        sbx.kill()
    check(not sbx.is_running(), "killed sandbox is not running")


def commands():
    sbx = Sandbox.create(api_key=ALICE)
    try:
        r = sbx.commands.run("pwd; echo $HOME; echo err >&2")
        check(r.stdout == "/home/user\n/home/user\n", f"home: {r.stdout!r}")
        check(r.stderr == "err\n", f"stderr: {r.stderr!r}")
        try:
            sbx.commands.run("echo out; exit 3")
            raise AssertionError("exit 3 raises")
        except CommandExitException as e:
            check(e.exit_code == 3 and e.stdout == "out\n", f"exit 3: {e}")
        # env and cwd
        r = sbx.commands.run("echo $GREETING", envs={"GREETING": "hello"})
        check(r.stdout == "hello\n", f"env: {r.stdout!r}")
        sbx.commands.run("mkdir -p /home/user/sub")
        r = sbx.commands.run("pwd", cwd="/home/user/sub")
        check(r.stdout == "/home/user/sub\n", f"cwd: {r.stdout!r}")
        r = sbx.commands.run("pwd", cwd="sub")
        check(r.stdout == "/home/user/sub\n", f"relative cwd: {r.stdout!r}")
        if ENGINE == "container":
            # A container's processes see the container: any directory of its
            # root is a working directory.
            r = sbx.commands.run("pwd", cwd="/tmp")
            check(r.stdout == "/tmp\n", f"cwd /tmp: {r.stdout!r}")
        else:
            # The subprocess engine's processes see the host: a cwd outside the
            # sandbox's workdir is refused.
            try:
                sbx.commands.run("pwd", cwd="/tmp")
                raise AssertionError("cwd /tmp is refused on the subprocess engine")
            except CommandExitException:
                raise
            except Exception as e:
                check("PATH_ESCAPE" in str(e) or "outside" in str(e), f"cwd /tmp: {e}")
        # stdin: send, then close
        h = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(h.pid, "abc\n")
        sbx.commands.send_stdin(h.pid, "def\n")
        sbx.commands.close_stdin(h.pid)
        r = h.wait()
        check(r.stdout == "abc\ndef\n", f"stdin: {r.stdout!r}")
        # live output through callbacks
        seen = []
        sbx.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=seen.append)
        check("".join(seen) == "1\n2\n3\n", f"on_stdout: {seen!r}")
        # timeout: the client gives up, the server answers it as a timeout
        t0 = time.time()
        try:
            sbx.commands.run("sleep 20", timeout=1)
            raise AssertionError("a 1 s timeout fires")
        except TimeoutException:
            check(time.time() - t0 < 10, "the timeout fired within 10 s")
        # list, connect to a running one, kill by pid
        h = sbx.commands.run(
            "for i in 1 2 3 4 5; do echo line$i; sleep 0.3; done", background=True
        )
        listed = {p.pid: p for p in sbx.commands.list()}
        check(h.pid in listed, f"list has {h.pid}: {list(listed)}")
        check(listed[h.pid].cmd == "/bin/bash", f"listed cmd {listed[h.pid].cmd}")
        again = sbx.commands.connect(h.pid)
        r = again.wait()
        check("line5\n" in r.stdout, f"connect sees the output: {r.stdout!r}")
        check(h.pid not in {p.pid for p in sbx.commands.list()}, "ended ones leave the list")
        s = sbx.commands.run("sleep 30", background=True)
        check(sbx.commands.kill(s.pid) is True, "commands.kill")
        check(sbx.commands.kill(987654) is False, "killing an unknown pid answers False")
    finally:
        sbx.kill()


def files():
    sbx = Sandbox.create(api_key=ALICE)
    try:
        sbx.files.write("notes.txt", "some text\n")
        check(sbx.files.read("/home/user/notes.txt") == "some text\n", "relative write")
        blob = bytes(range(256)) * 64
        sbx.files.write("/home/user/blob.bin", blob)
        check(sbx.files.read("/home/user/blob.bin", format="bytes") == blob, "bytes")
        big = os.urandom(8 << 20)
        sbx.files.write("/home/user/big.bin", big)
        check(sbx.files.read("/home/user/big.bin", format="bytes") == big, "an 8 MiB file round trip")
        r = sbx.commands.run("wc -c < /home/user/blob.bin")
        check(r.stdout.strip() == str(len(blob)), f"the sandbox sees the bytes: {r.stdout}")
        sbx.files.write_files(
            [{"path": "/home/user/m/one.txt", "data": "1"}, {"path": "/home/user/m/two.txt", "data": "2"}]
        )
        names = sorted(e.name for e in sbx.files.list("/home/user/m"))
        check(names == ["one.txt", "two.txt"], f"list: {names}")
        deep = [e.path for e in sbx.files.list("/home/user", depth=2)]
        check("/home/user/m/two.txt" in deep, f"depth 2: {deep}")
        check(sbx.files.exists("/home/user/notes.txt"), "exists")
        check(not sbx.files.exists("/home/user/nope"), "does not exist")
        info = sbx.files.get_info("/home/user/blob.bin")
        check(info.size == len(blob) and info.type.value == "file", f"info: {info}")
        check(sbx.files.make_dir("/home/user/d") is True, "make_dir")
        check(sbx.files.make_dir("/home/user/d") is False, "make_dir again")
        moved = sbx.files.rename("/home/user/notes.txt", "/home/user/d/notes.txt")
        check(moved.path == "/home/user/d/notes.txt", f"rename: {moved}")
        check(sbx.files.read("d/notes.txt") == "some text\n", "renamed content")
        sbx.files.remove("/home/user/d")
        check(not sbx.files.exists("/home/user/d"), "removed")
        # As E2B's: removing what is not there is not an error.
        sbx.files.remove("/home/user/never-there")
        # Octet-stream uploads: a file-like object streams, gzip compresses.
        sbx.files.write("m/streamed.bin", io.BytesIO(blob))
        check(sbx.files.read("m/streamed.bin", format="bytes") == blob, "an octet-stream upload")
        sbx.files.write("m/zipped.bin", blob, gzip=True)
        check(sbx.files.read("m/zipped.bin", format="bytes") == blob, "a gzip upload")
        # Signed URLs, fetched with no token: a download, an upload, an expired one.
        r = httpx.get(sbx.download_url("m/one.txt", use_signature_expiration=60))
        check((r.status_code, r.text) == (200, "1"), f"signed download: {r.status_code} {r.text}")
        up = sbx.upload_url("m/up.txt")
        r = httpx.post(up, files={"file": ("up.txt", b"uploaded")})
        check(r.status_code == 200 and sbx.files.read("m/up.txt") == "uploaded", f"signed upload: {r.text}")
        r = httpx.get(sbx.download_url("m/one.txt", use_signature_expiration=-120))
        check(r.status_code == 401 and r.json()["message"] == "signature is already expired", f"expired: {r.text}")
        # Outside the home, the filesystem service still sees the sandbox's own files.
        check(sbx.files.exists("/bin/sh") or sbx.files.exists("/usr/bin/sh"), "a system file")
        try:
            sbx.files.read("/home/user/nope.txt")
            raise AssertionError("reading a missing file raises")
        except NotFoundException:
            pass
    finally:
        sbx.kill()


def pty():
    sbx = Sandbox.create(api_key=ALICE)
    try:
        handle = sbx.pty.create(PtySize(rows=24, cols=80))
        got = bytearray()
        done = threading.Event()

        def read():
            try:
                for _stdout, _stderr, data in handle:
                    if data:
                        got.extend(data)
                        if b"cols=132" in got:
                            done.set()
            except Exception:
                pass
            done.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        sbx.pty.resize(handle.pid, PtySize(rows=40, cols=132))
        sbx.pty.send_stdin(handle.pid, b"echo cols=$(tput cols 2>/dev/null || stty size | cut -d' ' -f2)\n")
        done.wait(15)
        check(b"cols=132" in got, f"the resized pty answers: {bytes(got)[-300:]!r}")
        check(sbx.pty.kill(handle.pid) is True, "pty kill")
        reader.join(10)
    finally:
        sbx.kill()


def lifecycle():
    a = Sandbox.create(api_key=ALICE, metadata={"suite": "e2b", "n": "1"})
    b = Sandbox.create(api_key=ALICE, metadata={"suite": "e2b", "n": "2"})
    try:
        found = Sandbox.list(api_key=ALICE, query=SandboxQuery(metadata={"n": "1"})).next_items()
        check([s.sandbox_id for s in found] == [a.sandbox_id], f"metadata filter: {found}")
        both = Sandbox.list(api_key=ALICE, query=SandboxQuery(metadata={"suite": "e2b"})).next_items()
        # Newest first, as E2B's (ids are random: the order is that of their starts).
        check([s.sandbox_id for s in both] == [b.sandbox_id, a.sandbox_id], f"both, newest first: {both}")
        oldest = Sandbox.list(api_key=ALICE, order="asc", query=SandboxQuery(metadata={"suite": "e2b"})).next_items()
        check([s.sandbox_id for s in oldest] == [a.sandbox_id, b.sandbox_id], f"asc: {oldest}")
        check(found[0].metadata == {"suite": "e2b", "n": "1"}, f"metadata: {found[0].metadata}")
        # paging, one at a time, in either order
        for order, expected in [(None, [b, a]), ("asc", [a, b])]:
            pager = Sandbox.list(api_key=ALICE, limit=1, order=order, query=SandboxQuery(metadata={"suite": "e2b"}))
            first = pager.next_items()
            check(len(first) == 1 and pager.has_next, "a page of one, and more")
            second = pager.next_items()
            check(len(second) == 1 and not pager.has_next, "the next page, the last")
            pages = [first[0].sandbox_id, second[0].sandbox_id]
            check(pages == [x.sandbox_id for x in expected], f"pages, order {order}: {pages}")
        # started at or after a time: inclusive of b's own start, not of a second later
        started = b.get_info().started_at
        after = Sandbox.list(api_key=ALICE, query=SandboxQuery(metadata={"suite": "e2b"}, started_after=started)).next_items()
        check(b.sandbox_id in [s.sandbox_id for s in after], f"started_after, inclusive: {after}")
        later = Sandbox.list(
            api_key=ALICE,
            query=SandboxQuery(metadata={"suite": "e2b"}, started_after=started + datetime.timedelta(seconds=1)),
        ).next_items()
        check(later == [], f"started_after a second later: {later}")
        # set_timeout: the sandbox ends when it passes
        b.set_timeout(1)
        deadline = time.time() + 10
        while b.is_running() and time.time() < deadline:
            time.sleep(0.2)
        check(not b.is_running(), "the sandbox ended after its timeout")
        check(Sandbox.kill(b.sandbox_id, api_key=ALICE) is False, "gone from the control plane")
        # A sandbox ended through the native API leaves the E2B list too.
        c = Sandbox.create(api_key=ALICE)
        r = httpx.delete(f"{URL}/v1/sandboxes/{c.sandbox_id}", headers={"Authorization": f"Bearer {ALICE}"})
        check(r.status_code in (200, 204), f"native destroy: {r.status_code} {r.text}")
        deadline = time.time() + 30
        while time.time() < deadline:
            if c.sandbox_id not in {s.sandbox_id for s in Sandbox.list(api_key=ALICE).next_items()}:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("a natively destroyed sandbox stays listed")
        # pause and resume
        a.files.write("/home/user/kept.txt", "kept")
        if ENGINE == "container":
            check(a.pause() is True, "pause")
            check(a.get_info().state.value == "paused", "paused state")
            check(a.pause() is False, "already paused")
            # Its agent is not there, as E2B's proxy says: not running, no exception.
            check(a.is_running() is False, "a paused sandbox is not running")
            resumed = Sandbox.connect(a.sandbox_id, api_key=ALICE)
            check(resumed.get_info().state.value == "running", "running again")
            check(resumed.is_running() is True, "running after resume")
            check(resumed.files.read("/home/user/kept.txt") == "kept", "files kept")
            check(resumed.commands.run("echo back").stdout == "back\n", "commands after resume")
        else:
            try:
                a.pause()
                raise AssertionError("the subprocess engine has no freezer")
            except Exception as e:
                check("pause" in str(e).lower(), f"the refusal says why: {e}")
    finally:
        a.kill()
        Sandbox.kill(b.sandbox_id, api_key=ALICE)


def envelope(flag, payload):
    return struct.pack(">BI", flag, len(payload)) + payload


def bad_input():
    # A wrong API key.
    try:
        Sandbox.create(api_key="not-a-key-of-this-server")
        raise AssertionError("a wrong key is refused")
    except AuthenticationException:
        pass
    # An unknown sandbox.
    try:
        Sandbox.connect("sp-00000000000000000000000000000000-0", api_key=ALICE)
        raise AssertionError("an unknown sandbox is refused")
    except NotFoundException:
        pass
    check(Sandbox.kill("no-such-sandbox", api_key=ALICE) is False, "kill unknown")
    sbx = Sandbox.create(api_key=ALICE)
    try:
        base = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
        token = sbx._envd_access_token
        # A wrong access token: answered as a sandbox that does not exist (the id
        # alone tells a stranger nothing).
        r = httpx.post(
            f"{URL}/process.Process/List",
            headers={**base, "X-Access-Token": "wrong", "Content-Type": "application/json"},
            content=b"{}",
        )
        ghost = "sp-" + os.urandom(16).hex()
        g = httpx.post(
            f"{URL}/process.Process/List",
            headers={**base, "E2b-Sandbox-Id": ghost, "X-Access-Token": "wrong", "Content-Type": "application/json"},
            content=b"{}",
        )
        check(r.status_code == 502 and r.json()["code"] == "unavailable", f"token: {r.status_code} {r.text}")
        check(
            (g.status_code, g.text.replace(ghost, "<id>")) == (r.status_code, r.text.replace(sbx.sandbox_id, "<id>")),
            f"a wrong token and an unknown sandbox: {r.text} {g.text}",
        )
        ok = {**base, "X-Access-Token": token}
        # Malformed Connect frames, each answered with a Connect error, never a 5xx.
        for body in [b"\x00\x00", envelope(0, b"{not json"), envelope(1, b"{}"), envelope(0, b"x" * 10)[:8]]:
            r = httpx.post(
                f"{URL}/process.Process/Start",
                headers={**ok, "Content-Type": "application/connect+json"},
                content=body,
            )
            check(r.status_code < 500, f"frame {body!r}: {r.status_code}")
            flag, n = struct.unpack(">BI", r.content[:5])
            end = json.loads(r.content[5 : 5 + n])
            check(flag == 2 and end["error"]["code"] == "invalid_argument", f"frame {body!r}: {end}")
        r = httpx.post(
            f"{URL}/process.Process/SendInput",
            headers={**ok, "Content-Type": "application/json"},
            content=b'{"process": {"pid": 1}, "input": {"stdin": "!!"}}',
        )
        check(r.status_code == 404 and r.json()["code"] == "not_found", f"unknown pid: {r.text}")
        r = httpx.post(
            f"{URL}/process.Process/List",
            headers={**ok, "Content-Type": "application/proto"},
            content=b"\x00",
        )
        check(r.status_code == 415, f"protobuf is refused: {r.status_code}")
        # The caller's deadline ends a stream on the server too.
        t0 = time.time()
        r = httpx.post(
            f"{URL}/process.Process/Start",
            headers={**ok, "Content-Type": "application/connect+json", "Connect-Timeout-Ms": "500"},
            content=envelope(0, json.dumps({"process": {"cmd": "/bin/sleep", "args": ["5"]}}).encode()),
            timeout=10,
        )
        last = r.content[r.content.rfind(b"\x02\x00\x00"):]
        flag, n = struct.unpack(">BI", last[:5])
        end = json.loads(last[5 : 5 + n])
        check(end.get("error", {}).get("code") == "deadline_exceeded", f"deadline: {end}")
        check(time.time() - t0 < 4, f"ended at the deadline, after {time.time() - t0:.1f} s")
        r = httpx.post(f"{URL}/v2/sandboxes", headers={"X-API-Key": ALICE}, content=b"{nope")
        check(r.status_code == 400 and r.json()["code"] == 400, f"bad body: {r.text}")
    finally:
        sbx.kill()


def tenants():
    mine = Sandbox.create(api_key=ALICE, metadata={"owner": "alice"})
    theirs = Sandbox.create(api_key=BOB)
    try:
        try:
            Sandbox.connect(mine.sandbox_id, api_key=BOB)
            raise AssertionError("bob cannot connect to alice's sandbox")
        except NotFoundException:
            pass
        try:
            Sandbox.get_info(mine.sandbox_id, api_key=BOB)
            raise AssertionError("bob cannot see alice's sandbox")
        except NotFoundException:
            pass
        check(Sandbox.kill(mine.sandbox_id, api_key=BOB) is False, "bob cannot kill it")
        for method, path in [("GET", ""), ("POST", "/pause"), ("POST", "/timeout"), ("POST", "/connect")]:
            r = httpx.request(method, f"{URL}/sandboxes/{mine.sandbox_id}{path}", headers={"X-API-Key": BOB}, json={"timeout": 5})
            check(r.status_code == 404 and mine.sandbox_id in r.json()["message"], f"bob {method} {path}: {r.status_code} {r.text}")
            ghost = httpx.request(method, f"{URL}/sandboxes/sp-none-0{path}", headers={"X-API-Key": BOB}, json={"timeout": 5})
            check(ghost.status_code == 404, f"a sandbox that never was, {method} {path}: {ghost.status_code}")
        try:
            Sandbox.set_timeout(mine.sandbox_id, 1, api_key=BOB)
            raise AssertionError("bob cannot set its timeout")
        except NotFoundException:
            pass
        listed = {s.sandbox_id for s in Sandbox.list(api_key=BOB).next_items()}
        check(mine.sandbox_id not in listed and theirs.sandbox_id in listed, f"bob's list: {listed}")
        # Bob's own sandbox token opens no other sandbox.
        r = httpx.post(
            f"{URL}/process.Process/List",
            headers={
                "E2b-Sandbox-Id": mine.sandbox_id,
                "E2b-Sandbox-Port": "49983",
                "X-Access-Token": theirs._envd_access_token,
                "Content-Type": "application/json",
            },
            content=b"{}",
        )
        check(r.status_code == 502 and "was not found" in r.text, f"bob's token on alice's sandbox: {r.status_code}")
        check(mine.commands.run("echo still").stdout == "still\n", "alice's sandbox is untouched")
    finally:
        mine.kill()
        theirs.kill()


def code_interpreter():
    ci = CodeInterpreter.create(api_key=ALICE)
    other = CodeInterpreter.create(api_key=BOB)
    try:
        # The issue's snippet: state persists between calls in one context.
        ci.run_code("x = 41")
        check(ci.run_code("x + 1").text == "42", "x + 1")
        out = []
        e = ci.run_code(
            "import sys, os\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nos.system('echo from a child')\n1/0",
            on_stdout=lambda m: out.append(m.line),
        )
        # Output comes in chunks as it is read (a print and a child's write may share
        # one), as from E2B's own kernels: the text is what counts.
        check("".join(e.logs.stdout) == "to stdout\nfrom a child\n", f"stdout: {e.logs.stdout}")
        check(e.logs.stderr == ["to stderr\n"], f"stderr: {e.logs.stderr}")
        check("".join(out) == "to stdout\nfrom a child\n", f"on_stdout: {out}")
        check(e.error.name == "ZeroDivisionError" and e.error.value == "division by zero", f"error: {e.error}")
        check("<cell>" in e.error.traceback and "python.py" not in e.error.traceback, f"traceback: {e.error.traceback}")
        check(e.execution_count == 3, f"execution_count {e.execution_count}")
        # Rich results from _repr_*_.
        r = ci.run_code("class Table:\n    def _repr_html_(self): return '<table></table>'\n    def _repr_markdown_(self): return '| a |'\nTable()")
        main = r.results[0]
        check(main.is_main_result and main.html == "<table></table>" and main.markdown == "| a |", f"rich: {main}")
        check(r.text.startswith("<__main__.Table object"), f"text: {r.text}")
        # env_vars for one execution only.
        r = ci.run_code("import os\nos.environ.get('ONLY_NOW')", envs={"ONLY_NOW": "yes"})
        check(r.text == "'yes'", f"envs: {r.text}")
        check(ci.run_code("import os\nos.environ.get('ONLY_NOW')").text is None, "envs are not kept")
        # Characters some readers take for line ends stay inside their line.
        r = ci.run_code("print('a\\u2028b\\u0085c')")
        check("".join(r.logs.stdout) == "a\u2028b\u0085c\n", f"U+2028 and U+0085: {r.logs.stdout}")
        # The policy stage sees the code: a refusal is the execution's error, and
        # the code never ran.
        r = ci.run_code("x = 'PADDOCK_POLICY_MARKER'")
        check(r.error is not None and r.error.name == "CODE_BLOCKED" and "no-marker" in r.error.value, f"policy: {r.error}")
        check(ci.run_code("x + 1").text == "42", "the refused code did not run")
        # Past the SDK's timeout the call ends, and the code is interrupted: the
        # context lives on with its state, and is free at once.
        started = time.time()
        try:
            ci.run_code("import time\nwhile True: time.sleep(0.05)", timeout=1)
            raise AssertionError("a run past its timeout raises")
        except TimeoutException:
            pass
        check(ci.run_code("x + 1").text == "42", "the context lives on after the interrupt")
        check(time.time() - started < 10, f"the interrupted run held the context {time.time() - started:.1f} s")
        # Code that swallows the interrupt loses its interpreter after a grace.
        try:
            ci.run_code("import time\nwhile True:\n    try: time.sleep(0.05)\n    except KeyboardInterrupt: pass", timeout=1)
            raise AssertionError("a run past its timeout raises")
        except TimeoutException:
            pass
        r = ci.run_code("x")
        check(r.error is not None and r.error.name == "NameError", f"a fresh interpreter after the grace: {r.text} {r.error}")
        ci.run_code("x = 41")
        # A second context has a namespace of its own, and a cwd.
        ctx = ci.create_code_context(cwd="/home/user")
        r = ci.run_code("x", context=ctx)
        check(r.error is not None and r.error.name == "NameError", f"a fresh namespace: {r.text} {r.error}")
        ci.run_code("y = 'in ctx'", context=ctx)
        check(ci.run_code("y", context=ctx).text == "'in ctx'", "the second context keeps its own")
        check(ci.run_code("import os\nos.getcwd()", context=ctx).text == "'/home/user'", "its cwd")
        ids = {c.id for c in ci.list_code_contexts()}
        check(ctx.id in ids, f"contexts: {ids}")
        ci.restart_code_context(ctx)
        check(ci.run_code("y", context=ctx).error.name == "NameError", "restart clears the namespace")
        ci.remove_code_context(ctx)
        check(ctx.id not in {c.id for c in ci.list_code_contexts()}, "removed")
        # JavaScript contexts, on node.
        js = ci.create_code_context(language="javascript")
        ci.run_code("var count = 41; console.log('from node')", context=js)
        r = ci.run_code("count + 1", context=js)
        check(r.text == "42", f"js state: {r.text} {r.error}")
        r = ci.run_code("Promise.resolve([1, 2]).then(a => a.length)", context=js)
        check(r.text == "2", f"js promise: {r.text} {r.error}")
        r = ci.run_code("console.log('out'); undefinedThing.x", context=js)
        check(r.logs.stdout == ["out\n"] and r.error.name == "ReferenceError", f"js error: {r.logs} {r.error}")
        check("<cell>" in r.error.traceback and "runInThisContext" not in r.error.traceback, f"js traceback: {r.error.traceback}")
        r = ci.run_code("1 + 1", language="javascript")
        check(r.text == "2", f"the default javascript context: {r.text} {r.error}")
        ci.remove_code_context(js)
        # Files written by code are the sandbox's files.
        ci.run_code("open('/home/user/from_code.txt', 'w').write('hello')")
        check(ci.files.read("/home/user/from_code.txt") == "hello", "files from code")
        # Bob's tokens open none of Alice's interpreter.
        r = httpx.post(
            f"{URL}/execute",
            headers={
                "E2b-Sandbox-Id": ci.sandbox_id,
                "E2b-Sandbox-Port": "49999",
                "X-Access-Token": other._envd_access_token,
                "E2B-Traffic-Access-Token": other.traffic_access_token or "",
            },
            json={"code": "x"},
        )
        check(r.status_code == 502 and "was not found" in r.text, f"bob's tokens on alice's interpreter: {r.status_code}")
        # The base template serves no interpreter.
        base = Sandbox.create(api_key=ALICE)
        try:
            r = httpx.post(
                f"{URL}/execute",
                headers={"E2b-Sandbox-Id": base.sandbox_id, "E2b-Sandbox-Port": "49999", "X-Access-Token": base._envd_access_token},
                json={"code": "1"},
            )
            check(r.status_code == 502 and "not open" in r.text, f"base: {r.status_code} {r.text}")
        finally:
            base.kill()
    finally:
        ci.kill()
        other.kill()


def ports():
    """A sandbox's own ports: private by default (its traffic token opens them, and
    without it the answer is that of a sandbox that does not exist); open to anyone
    with `allow_public_traffic`, whose agent still takes its token."""
    sbx = Sandbox.create(api_key=ALICE)
    check(sbx.traffic_access_token, "a private sandbox has a traffic token")
    token = traffic_header(sbx)
    try:
        sbx.files.write("/home/user/site/hello.txt", "served from the sandbox")
        server = sbx.commands.run(
            "exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /home/user/site",
            background=True,
        )
        host = sbx.get_host(8000)
        check(host == f"8000-{sbx.sandbox_id}.e2b.test", f"get_host: {host}")
        deadline = time.time() + 15
        while True:
            # By host name, as get_host builds it, with the traffic token...
            r = httpx.get(f"{URL}/hello.txt", headers={"Host": host, **token})
            if r.status_code == 200 or time.time() > deadline:
                break
            check(r.status_code == 502 and "not open" in r.text, f"before the server: {r.status_code} {r.text}")
            time.sleep(0.2)
        check(r.status_code == 200 and r.text == "served from the sandbox", f"by host: {r.status_code} {r.text}")
        # ...and by the headers, with a body and a query.
        r = httpx.post(
            f"{URL}/nothing-here?x=1",
            headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000", **token},
            content=b"abc",
        )
        check(r.status_code == 501, f"the server's own answer comes back: {r.status_code}")
        r = httpx.get(f"{URL}/", headers={"Host": f"8001-{sbx.sandbox_id}.e2b.test", **token})
        check(r.status_code == 502 and "not open" in r.text, f"a closed port: {r.status_code} {r.text}")
        # Without the traffic token (or with the access token alone): the answer of
        # a sandbox that does not exist.
        ghost = "sp-" + os.urandom(16).hex()
        g = httpx.get(f"{URL}/hello.txt", headers={"Host": f"8000-{ghost}.e2b.test"})
        for headers in [{}, {"X-Access-Token": sbx._envd_access_token}, {"E2B-Traffic-Access-Token": "wrong"}]:
            r = httpx.get(f"{URL}/hello.txt", headers={"Host": host, **headers})
            check(r.status_code == 502 and "was not found" in r.text, f"without the token: {r.status_code} {r.text}")
            check(r.text.replace(sbx.sandbox_id, "<id>") == g.text.replace(ghost, "<id>"), f"{r.text} {g.text}")
        # The agent by host name too.
        r = httpx.get(f"{URL}/health", headers={"Host": f"49983-{sbx.sandbox_id}.e2b.test", "X-Access-Token": sbx._envd_access_token})
        check(r.status_code == 204, f"agent by host: {r.status_code}")
        server.kill()
        websocket(sbx)
    finally:
        sbx.kill()
    r = httpx.get(f"{URL}/hello.txt", headers={"Host": host, **token})
    check(r.status_code == 502 and "was not found" in r.text, f"after kill: {r.status_code} {r.text}")
    # A public sandbox: its ports need no token, its agent still does.
    pub = Sandbox.create(api_key=ALICE, network={"allow_public_traffic": True})
    try:
        check(pub.traffic_access_token is None, f"a public sandbox's traffic token: {pub.traffic_access_token}")
        pub.files.write("/home/user/site/hello.txt", "public")
        pub.commands.run(
            "exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /home/user/site",
            background=True,
        )
        deadline = time.time() + 15
        while True:
            r = httpx.get(f"{URL}/hello.txt", headers={"Host": pub.get_host(8000)})
            if r.status_code == 200 or time.time() > deadline:
                break
            time.sleep(0.2)
        check(r.status_code == 200 and r.text == "public", f"a public port: {r.status_code} {r.text}")
        r = httpx.get(f"{URL}/health", headers={"Host": f"49983-{pub.sandbox_id}.e2b.test"})
        check(r.status_code == 502, f"a public sandbox's agent without its token: {r.status_code}")
    finally:
        pub.kill()


# A WebSocket server in the sandbox: the handshake by the RFC 6455 rules, then every
# text frame it receives is sent back upper-cased, until a close frame.
WS_SERVER = r"""
import base64, hashlib, socket, struct
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765)); s.listen(4)
while True:
    c, _ = s.accept(); f = c.makefile("rb")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += f.read(1)
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while True:
        head2 = f.read(2)
        if len(head2) < 2:
            break  # the client went away without a close
        b0, b1 = head2
        n = b1 & 127
        if n == 126: n = struct.unpack(">H", f.read(2))[0]
        mask = f.read(4); data = bytes(x ^ mask[i % 4] for i, x in enumerate(f.read(n)))
        if b0 & 15 == 8:
            c.sendall(b"\x88\x00"); break
        out = data.upper()
        c.sendall(bytes([0x81, len(out)]) + out)
    f.close(); c.shutdown(socket.SHUT_RDWR); c.close()
"""


def traffic_header(sbx):
    """The header a private sandbox's own ports take (none for a public one)."""
    t = sbx.traffic_access_token
    return {"E2B-Traffic-Access-Token": t} if t else {}


def ws_frame(opcode, data):
    """A masked client frame (payload under 126 bytes)."""
    import os as _os
    mask = _os.urandom(4)
    return bytes([0x80 | opcode, 0x80 | len(data)]) + mask + bytes(x ^ mask[i % 4] for i, x in enumerate(data))


def ws_open(sbx, key, patience=15):
    """An upgrade to the sandbox's WebSocket server on port 8765, through get_host's
    name, retried until it is answered 101 (or `patience` s pass): the socket, its
    reader, the status line and the answer's headers."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(URL)
    traffic = f"E2B-Traffic-Access-Token: {sbx.traffic_access_token}\r\n" if sbx.traffic_access_token else ""
    request = (
        f"GET /chat HTTP/1.1\r\nHost: {sbx.get_host(8765)}\r\nUpgrade: websocket\r\n{traffic}"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key.decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    deadline = time.time() + patience
    while True:
        c = socket.create_connection((u.hostname, u.port), timeout=10)
        c.sendall(request)
        f = c.makefile("rb")
        status = f.readline()
        if b" 101 " in status or time.time() > deadline:
            break
        f.close()
        c.close()
        time.sleep(0.2)
    headers = {}
    while True:
        line = f.readline().rstrip(b"\r\n")
        if not line:
            break
        k, v = line.split(b":", 1)
        headers[k.strip().lower()] = v.strip()
    return c, f, status, headers


def websocket(sbx):
    """A WebSocket to a server in the sandbox, through get_host's name: the handshake
    is the server's own, and frames go both ways until a close."""
    import base64
    import hashlib

    sbx.files.write("/home/user/ws.py", WS_SERVER)
    server = sbx.commands.run("exec python3 /home/user/ws.py", background=True)
    key = base64.b64encode(os.urandom(16))
    c, f, status, headers = ws_open(sbx, key)
    check(b" 101 " in status, f"the upgrade: {status!r}")
    want = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    check(headers.get(b"sec-websocket-accept") == want, f"the server's accept key: {headers}")
    for word in [b"hello", b"sandbox"]:
        c.sendall(ws_frame(1, word))
        b0, n = f.read(2)
        check((b0, f.read(n)) == (0x81, word.upper()), f"echo of {word}")
    c.sendall(ws_frame(8, b""))
    check(f.read(2) == b"\x88\x00", "the server's close frame")
    # The server closes its connection after the close; the client sees it end.
    started = time.time()
    check(f.read(1) == b"", "the connection ends after the close")
    check(time.time() - started < 5, f"the end took {time.time() - started:.1f} s")
    f.close()
    c.close()
    # A second WebSocket goes through as well.
    c, f, status, _ = ws_open(sbx, key)
    check(b" 101 " in status, f"a second upgrade: {status!r}")
    c.sendall(ws_frame(1, b"again"))
    b0, n = f.read(2)
    check((b0, f.read(n)) == (0x81, b"AGAIN"), "the second connection's echo")
    f.close()
    c.close()
    # Another upgrade than WebSocket is refused.
    r = httpx.get(f"{URL}/", headers={"Host": sbx.get_host(8765), "Upgrade": "h2c", "Connection": "Upgrade", **traffic_header(sbx)})
    check(r.status_code == 501, f"an h2c upgrade: {r.status_code}")
    server.kill()


def watch():
    sbx = Sandbox.create(api_key=ALICE)
    try:
        sbx.files.make_dir("/home/user/w")
        sbx.files.write("/home/user/w/old.txt", "old")
        # Polled, as the sync SDK does it.
        h = sbx.files.watch_dir("/home/user/w", recursive=True)
        sbx.files.write("/home/user/w/new.txt", "new")
        sbx.commands.run("echo more >> /home/user/w/old.txt; mkdir -p /home/user/w/sub; echo x > /home/user/w/sub/deep.txt")
        sbx.files.remove("/home/user/w/new.txt")
        seen = {(e.name, e.type.value) for e in h.get_new_events()}
        check(("old.txt", "write") in seen, f"write: {seen}")
        check(("sub/deep.txt", "create") in seen, f"recursive create: {seen}")
        check(not any(n == "new.txt" for n, _ in seen), f"created and removed between two looks: {seen}")
        sbx.files.remove("/home/user/w/old.txt")
        seen = {(e.name, e.type.value) for e in h.get_new_events()}
        check(seen == {("old.txt", "remove")}, f"remove: {seen}")
        check(h.get_new_events() == [], "nothing new")
        h.stop()
        # Streamed, as the async SDK does it.
        import asyncio
        from e2b import AsyncSandbox

        async def streamed():
            a = await AsyncSandbox.connect(sbx.sandbox_id, api_key=ALICE)
            got = []
            handle = await a.files.watch_dir("/home/user/w", on_event=lambda e: got.append((e.name, e.type.value)))
            await a.files.write("/home/user/w/streamed.txt", "s")
            deadline = time.time() + 10
            while ("streamed.txt", "create") not in got and time.time() < deadline:
                await asyncio.sleep(0.1)
            await handle.stop()
            return got

        got = asyncio.run(streamed())
        check(("streamed.txt", "create") in got, f"streamed: {got}")
    finally:
        sbx.kill()


def metadata():
    """File metadata (envd 0.6.2): set by an upload, read back by stat, list and move,
    replaced (so cleared) by the next upload, kept in the file's `user.e2b.`
    attributes (what a program sets there is metadata too); bad metadata writes
    nothing."""
    sbx = Sandbox.create(api_key=ALICE)
    try:
        meta = {"author": "mish", "purpose": "upload"}
        info = sbx.files.write("meta/a.txt", "x", metadata=meta)
        check(info.metadata == meta, f"the upload's answer: {info}")
        check(sbx.files.get_info("meta/a.txt").metadata == meta, "stat")
        info = sbx.files.write("meta/b.txt", "y", metadata=meta, use_octet_stream=True)
        check(info.metadata == meta, f"an octet-stream upload's answer: {info}")
        infos = sbx.files.write_files(
            [{"path": "meta/c.txt", "data": "1"}, {"path": "meta/d.txt", "data": "2"}],
            metadata={"source": "suite"},
        )
        check([i.metadata for i in infos] == [{"source": "suite"}] * 2, f"every file of an upload: {infos}")
        listed = {e.name: e.metadata for e in sbx.files.list("meta")}
        check(listed["a.txt"] == meta and listed["d.txt"] == {"source": "suite"}, f"listed: {listed}")
        moved = sbx.files.rename("meta/a.txt", "meta/moved.txt")
        check(moved.metadata == meta, f"moved: {moved}")
        info = sbx.files.write("meta/moved.txt", "again")
        check(info.metadata is None, f"overwritten without metadata: {info}")
        check(sbx.files.get_info("meta/moved.txt").metadata is None, "the old metadata is gone")
        sbx.commands.run(
            "python3 -c \"import os; os.setxattr('/home/user/meta/b.txt', 'user.e2b.by', b'program')\""
        )
        got = sbx.files.get_info("meta/b.txt").metadata
        check(got == {**meta, "by": "program"}, f"set by a program: {got}")
        for bad in ({"bad key": "v"}, {"": "v"}, {"k": "bad\nvalue"}, {"k": "value\n"}):
            try:
                sbx.files.write("meta/bad.txt", "x", metadata=bad)
                raise AssertionError(f"{bad!r} was accepted")
            except InvalidArgumentException:
                pass
        check(not sbx.files.exists("meta/bad.txt"), "a refused write writes nothing")
    finally:
        sbx.kill()


def metrics():
    """get_metrics: samples of the sandbox's CPU, memory and disk, a busy CPU seen,
    nothing from before the sandbox existed."""
    start = datetime.datetime.now(datetime.timezone.utc)
    sbx = Sandbox.create(api_key=ALICE)
    try:
        sbx.commands.run(
            "end=$(($(date +%s) + 6)); i=0; while :; do i=$((i + 1)); "
            "if [ $((i % 20000)) -eq 0 ] && [ $(date +%s) -ge $end ]; then break; fi; done",
            background=True,
        )
        found = []
        deadline = time.time() + 15
        while time.time() < deadline:
            found = sbx.get_metrics()
            if any(m.cpu_used_pct >= 20 for m in found):
                break
            time.sleep(0.5)
        check(any(m.cpu_used_pct >= 20 for m in found), f"a busy CPU: {found}")
        m = found[-1]
        check(m.cpu_count >= 1 and 0 < m.mem_used <= m.mem_total, f"memory: {m}")
        check(0 <= m.disk_used <= m.disk_total and m.disk_total > 0, f"disk: {m}")
        check(m.timestamp.timestamp() >= start.timestamp() - 1, f"when: {m.timestamp} after {start}")
        before = sbx.get_metrics(
            start=start - datetime.timedelta(hours=1),
            end=start - datetime.timedelta(minutes=30),
        )
        check(before == [], f"before the sandbox: {before}")
    finally:
        sbx.kill()


def caps():
    """Run alone, against a server with server.max_requests_per_tenant = 3."""
    from e2b import RateLimitException

    sbx = Sandbox.create(api_key=ALICE)
    held = []
    try:
        # Three streams held open: the tenant's three places, for 4 s.
        for _ in range(3):
            held.append(sbx.commands.run("sleep 4", background=True))
        try:
            sbx.files.exists("/home/user")
            raise AssertionError("a fourth request is refused")
        except RateLimitException:
            pass
        try:
            Sandbox.list(api_key=ALICE).next_items()
            raise AssertionError("the control plane counts the same tenant")
        except RateLimitException:
            pass
        # Another tenant goes on.
        other = Sandbox.create(api_key=BOB)
        check(other.commands.run("echo bob").stdout == "bob\n", "bob is not capped by alice")
        other.kill()
        # Streams that end give their places back.
        deadline = time.time() + 15
        while True:
            try:
                check(sbx.files.exists("/home/user"), "exists")
                break
            except RateLimitException:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        for h in held:
            h.disconnect()
        sbx.kill()


def template_rootfs():
    """A template on an engine of its own (`[engines.tiny]`) gets that engine's root
    filesystem; the built-in template keeps the default one."""
    marker = os.environ["PADDOCK_TINY_MARKER"]
    sbx = Sandbox.create("tiny", api_key=ALICE)
    try:
        r = sbx.commands.run("cat /etc/paddock-root; pwd; echo $HOME")
        check(r.stdout == f"{marker}\n/home/user\n/home/user\n", f"the template's root: {r.stdout!r}")
        # Only what the root holds: no python3 there.
        r = sbx.commands.run("command -v python3 || echo none")
        check(r.stdout == "none\n", f"python3 in the tiny root: {r.stdout!r}")
        sbx.files.write("notes.txt", "in the tiny root")
        check(sbx.files.read("/home/user/notes.txt") == "in the tiny root", "files in the tiny root")
        check(sbx.commands.run("cat notes.txt").stdout == "in the tiny root", "a command reads the file")
        h = sbx.commands.run("sleep 30", background=True)
        check(h.kill() is True, "kill in the tiny root")
        info = Sandbox.get_info(sbx.sandbox_id, api_key=ALICE)
        check(info.template_id == "tiny", f"template id: {info.template_id}")
    finally:
        sbx.kill()
    other = Sandbox.create(api_key=ALICE)
    try:
        r = other.commands.run("cat /etc/paddock-root 2>/dev/null || echo absent; command -v python3 >/dev/null && echo python")
        check(r.stdout == "absent\npython\n", f"the base template's root: {r.stdout!r}")
    finally:
        other.kill()


def connect_proxy(tls_port):
    """An HTTP CONNECT proxy on a loopback port that takes every `NAME.e2b.test:443`
    to the server's TLS listener, and refuses any other name: it stands in for the
    wildcard DNS record (and the port 443) the domain mode needs. TLS goes through
    it end to end, checked against the names."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    seen = set()

    def pipe(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve(client):
        head = b""
        while b"\r\n\r\n" not in head:
            data = client.recv(4096)
            if not data:
                client.close()
                return
            head += data
        target = head.split(b" ")[1].decode()
        host, _, port = target.rpartition(":")
        seen.add(host)
        if not (host.endswith(".e2b.test") and port == "443"):
            client.sendall(b"HTTP/1.1 403 Forbidden\r\n\r\n")
            client.close()
            return
        upstream = socket.create_connection(("127.0.0.1", tls_port))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
        pipe(client, upstream)

    def accept():
        while True:
            c, _ = listener.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", seen


def domain_mode():
    """E2B_DOMAIN alone (no E2B_API_URL, no E2B_SANDBOX_URL): the control plane at
    https://api.e2b.test, the agent and the code interpreter at
    https://{port}-{id}.e2b.test, and a server of the sandbox by get_host, all over
    the TLS listener with its certificate checked."""
    check(os.environ.get("E2B_DOMAIN") == "e2b.test" and not URL, "run with E2B_DOMAIN only")
    proxy, seen = connect_proxy(int(os.environ["PADDOCK_TLS_PORT"]))
    os.environ["HTTPS_PROXY"] = os.environ["https_proxy"] = proxy
    sbx = Sandbox.create(api_key=ALICE)
    try:
        r = sbx.commands.run("echo hi")
        check((r.stdout, r.exit_code) == ("hi\n", 0), f"echo over TLS: {r}")
        sbx.files.write("/home/user/a.txt", "x")
        check(sbx.files.read("/home/user/a.txt") == "x", "files over TLS")
        h = sbx.commands.run("sleep 30", background=True)
        check(h.kill() is True, "kill over TLS")
        sbx.files.write("/home/user/site/index.html", "by name")
        server = sbx.commands.run(
            "exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /home/user/site",
            background=True,
        )
        host = sbx.get_host(8000)
        check(host == f"8000-{sbx.sandbox_id}.e2b.test", f"get_host: {host}")
        deadline = time.time() + 15
        with httpx.Client(proxy=proxy) as client:
            while True:
                r = client.get(f"https://{host}/index.html", headers=traffic_header(sbx))
                if r.status_code == 200 or time.time() > deadline:
                    break
                time.sleep(0.2)
        check(r.status_code == 200 and r.text == "by name", f"get_host over TLS: {r.status_code} {r.text}")
        server.kill()
        found = [s.sandbox_id for s in Sandbox.list(api_key=ALICE).next_items()]
        check(sbx.sandbox_id in found, "the list over TLS")
    finally:
        sbx.kill()
    ci = CodeInterpreter.create(api_key=ALICE)
    try:
        ci.run_code("x = 41")
        check(ci.run_code("x + 1").text == "42", "the code interpreter over TLS")
    finally:
        ci.kill()
    # Every call went to its https:// name.
    wanted = {"api.e2b.test", f"49983-{sbx.sandbox_id}.e2b.test", f"8000-{sbx.sandbox_id}.e2b.test", f"49999-{ci.sandbox_id}.e2b.test"}
    check(wanted <= seen, f"names reached: {sorted(seen)}")
    # The certificate is checked: without the run's CA (certifi's roots only), the
    # same name fails verification.
    import certifi
    import ssl

    try:
        httpx.get("https://api.e2b.test/health", proxy=proxy, verify=ssl.create_default_context(cafile=certifi.where()))
        raise AssertionError("an unknown CA's certificate was accepted")
    except httpx.ConnectError as e:
        check("CERTIFICATE_VERIFY_FAILED" in str(e), f"verification: {e}")


def ws_caps():
    """Run alone, against a server with server.max_websockets_per_tenant = 1: a
    sandbox's ports take one WebSocket at a time, and a closed one gives its place
    back."""
    import base64

    sbx = Sandbox.create(api_key=ALICE)
    try:
        sbx.files.write("/home/user/ws.py", WS_SERVER)
        server = sbx.commands.run("exec python3 /home/user/ws.py", background=True)
        key = base64.b64encode(os.urandom(16))
        c, f, status, _ = ws_open(sbx, key)
        check(b" 101 " in status, f"the first upgrade: {status!r}")
        c2, f2, status, _ = ws_open(sbx, key, patience=0)
        check(b" 429 " in status, f"a second one at once: {status!r}")
        f2.close()
        c2.close()
        f.close()
        c.close()
        c, f, status, _ = ws_open(sbx, key)
        check(b" 101 " in status, f"after the first closed: {status!r}")
        f.close()
        c.close()
        server.kill()
    finally:
        sbx.kill()


def network():
    """`allow_internet_access` and `network.denyOut`/`allowOut` narrow the template's
    network (template `open`: unrestricted) and never widen it."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    probe = (
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', %d), timeout=3)\"" % port
    )

    def reaches(sbx):
        try:
            return sbx.commands.run(probe, timeout=20).exit_code == 0
        except CommandExitException:
            return False

    try:
        # A partial deny list cannot be enforced as asked: refused, with what to send.
        try:
            Sandbox.create("open", api_key=ALICE, network={"deny_out": ["10.0.0.0/8"]}).kill()
            raise AssertionError("a partial denyOut was accepted")
        except AssertionError:
            raise
        except Exception as e:
            check("0.0.0.0/0" in str(e), f"the refusal says what to send: {e}")
        # Nor may an exception open what the template's network never reaches.
        try:
            Sandbox.create(
                "open", api_key=ALICE, network={"deny_out": ["0.0.0.0/0"], "allow_out": ["169.254.169.254"]}
            ).kill()
            raise AssertionError("an allowOut of the metadata address was accepted")
        except AssertionError:
            raise
        except Exception as e:
            check("link-local" in str(e), f"the refusal names the range: {e}")
        if ENGINE != "subprocess":
            # An unrestricted container reaches the network through the gateway,
            # which never dials the host's own loopback: nothing to tell apart here.
            return
        sbx = Sandbox.create("open", api_key=ALICE)
        try:
            check(reaches(sbx), "the template's unrestricted network reaches the listener")
        finally:
            sbx.kill()
        for opts in (
            {"allow_internet_access": False},
            {"network": {"deny_out": ["0.0.0.0/0"]}},
            # Denied but for a name: an allowlist that does not list the listener.
            {"network": {"deny_out": ["0.0.0.0/0"], "allow_out": ["example.test"]}},
        ):
            sbx = Sandbox.create("open", api_key=ALICE, **opts)
            try:
                check(not reaches(sbx), f"{opts}: the listener is out of reach")
            finally:
                sbx.kill()
    finally:
        listener.close()


CHECKS = [
    the_issue_snippet, commands, files, metadata, metrics, pty, lifecycle, bad_input,
    tenants, code_interpreter, ports, watch, network,
]

if __name__ == "__main__":
    wanted = sys.argv[1:]
    failed = 0
    optional = [caps, ws_caps, template_rootfs, domain_mode]
    if os.environ.get("PADDOCK_TINY_MARKER") and not wanted:
        optional.remove(template_rootfs)
        CHECKS.append(template_rootfs)
    for f in CHECKS + optional:
        chosen = f.__name__ in wanted if wanted else f not in optional
        if not chosen:
            continue
        try:
            f()
            print(f"ok {f.__name__}", flush=True)
        except Exception:
            failed += 1
            print(f"FAILED {f.__name__}", flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)
