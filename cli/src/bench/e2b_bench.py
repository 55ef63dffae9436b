"""`paddock bench e2b`: E2B's Python SDK against `paddock serve --e2b`, beside the
native API measured in the same run (through httpx, as a plain client would).

Prints one JSON object per measure: name, samples, p50_ms, p99_ms, min_ms, max_ms;
and one per comparison: name, the two measures, ratio_p50 and ratio_p99.
Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY; PADDOCK_BENCH_N (samples per
measure), PADDOCK_BENCH_WARMUP.
"""

import json
import os
import time

import httpx
from e2b import Sandbox
from e2b_code_interpreter import Sandbox as CodeInterpreter

URL = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]
N = int(os.environ.get("PADDOCK_BENCH_N", "50"))
WARMUP = int(os.environ.get("PADDOCK_BENCH_WARMUP", "5"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def measure(name, once, n=N):
    """Measures `once` `n` times (after the warm-up) and prints the figures; returns
    them."""
    for _ in range(WARMUP):
        once()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        once()
        samples.append((time.perf_counter() - t0) * 1000)
    figures = {
        "measure": name,
        "samples": n,
        "p50_ms": round(pct(samples, 50), 3),
        "p99_ms": round(pct(samples, 99), 3),
        "min_ms": round(min(samples), 3),
        "max_ms": round(max(samples), 3),
    }
    print(json.dumps(figures), flush=True)
    return figures


def compare(name, a, b):
    """Prints how measure `a` compares with measure `b` (its baseline)."""
    print(
        json.dumps(
            {
                "measure": name,
                "of": a["measure"],
                "against": b["measure"],
                "ratio_p50": round(a["p50_ms"] / b["p50_ms"], 3),
                "ratio_p99": round(a["p99_ms"] / b["p99_ms"], 3),
            }
        ),
        flush=True,
    )


def e2b_create_run_kill():
    sbx = Sandbox.create()
    r = sbx.commands.run("echo hi")
    assert r.stdout == "hi\n", r
    sbx.kill()


native = httpx.Client(base_url=URL, headers={"Authorization": f"Bearer {KEY}"})


def native_open_exec_destroy():
    r = native.post("/v1/sandboxes", json={"engine": os.environ.get("PADDOCK_BENCH_ENGINE", "subprocess")})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    r = native.post(f"/v1/sandboxes/{sid}/exec", json={"program": {"command": ["/bin/bash", "-l", "-c", "echo hi"]}})
    assert r.status_code == 200 and r.json()["stdout"] == "hi\n", r.text
    r = native.delete(f"/v1/sandboxes/{sid}")
    assert r.status_code == 204, r.text


measure("native_open_exec_destroy", native_open_exec_destroy)
measure("e2b_create_run_kill", e2b_create_run_kill)

sbx = Sandbox.create()
measure("e2b_commands_run_echo", lambda: sbx.commands.run("echo hi"))
r = native.post("/v1/sandboxes", json={"engine": os.environ.get("PADDOCK_BENCH_ENGINE", "subprocess")})
sid = r.json()["id"]
measure(
    "native_sandbox_exec_echo",
    lambda: native.post(f"/v1/sandboxes/{sid}/exec", json={"program": {"command": ["/bin/bash", "-l", "-c", "echo hi"]}}),
)
measure(
    "native_sandbox_exec_python",
    lambda: native.post(f"/v1/sandboxes/{sid}/exec", json={"program": {"language": "python", "code": "print(1+1)"}}),
)
native.delete(f"/v1/sandboxes/{sid}")

# A directory of 100 entries, listed through E2B's filesystem service (`ListDir`)
# and through the native files API, in the same sandbox: the Connect call with the
# same HTTP client as the native one (what the server costs), and the SDK's
# `files.list` (which adds the SDK's own work on 100 entries).
sbx.files.write_files([{"path": f"/home/user/list100/f{i:03}.txt", "data": "x" * i} for i in range(100)])
envd = httpx.Client(
    base_url=URL,
    headers={
        "e2b-sandbox-id": sbx.sandbox_id,
        "e2b-sandbox-port": "49983",
        "X-Access-Token": sbx._envd_access_token or "",
        "Connect-Protocol-Version": "1",
    },
)


def connect_list_dir():
    r = envd.post("/filesystem.Filesystem/ListDir", json={"path": "/home/user/list100", "depth": 1})
    assert r.status_code == 200 and len(r.json()["entries"]) == 100, r.text


def native_list_files():
    r = native.get(f"/v1/sandboxes/{sbx.sandbox_id}/files", params={"dir": "/home/user/list100"})
    assert r.status_code == 200 and len(r.json()) == 100, r.text


def sdk_list_dir():
    assert len(sbx.files.list("/home/user/list100")) == 100


e2b_list = measure("e2b_list_dir_100", connect_list_dir)
native_files = measure("native_list_files_100", native_list_files)
sdk_list = measure("e2b_sdk_files_list_100", sdk_list_dir)
compare("e2b_list_dir_100_vs_native", e2b_list, native_files)
compare("e2b_sdk_files_list_100_vs_native", sdk_list, native_files)
sbx.kill()

ci = CodeInterpreter.create()
ci.run_code("x = 1")


def run_code():
    e = ci.run_code("1+1")
    assert e.text == "2", e


measure("e2b_run_code_warm_context", run_code)
ci.kill()
