// Paddock's code-interpreter runner for JavaScript: one persistent global scope.
//
// Started by the host (`node_host.py`), which gives it two descriptors: requests
// arrive on PADDOCK_REQ_FD, one JSON object per line ({"code", "env", "n"}), and
// answers go to PADDOCK_PROTO_FD, one JSON object per line: "result" (the
// completion value of the code, awaited when it is a promise, inspected as text),
// "error" (name, value, traceback), then "end" (n, count). The code's own stdout and
// stderr are pipes the host reads.
// Everything of the runner's own lives in this function, out of the global scope the
// code runs in.
(() => {
"use strict";
const fs = require("fs");
const vm = require("vm");
const util = require("util");

const W = Number(process.env.PADDOCK_PROTO_FD);
const R = Number(process.env.PADDOCK_REQ_FD);
delete process.env.PADDOCK_PROTO_FD;
delete process.env.PADDOCK_REQ_FD;
const send = (o) => fs.writeSync(W, JSON.stringify(o) + "\n");

globalThis.require = require;
globalThis.module = { exports: {} };
let count = 0;

async function turn(req) {
  count += 1;
  const env = req.env || {};
  const saved = {};
  for (const k of Object.keys(env)) {
    saved[k] = process.env[k];
    process.env[k] = String(env[k]);
  }
  try {
    let value = vm.runInThisContext(String(req.code || ""), { filename: "<cell>" });
    if (value && typeof value.then === "function") {
      value = await value;
    }
    if (value !== undefined) {
      send({ type: "result", is_main_result: true, text: util.inspect(value) });
    }
  } catch (e) {
    const err = e instanceof Error ? e : new Error(String(e));
    send({
      type: "error",
      name: err.name || "Error",
      value: err.message || String(e),
      // The cell's own frames: the runner's are cut off.
      traceback: String(err.stack || e).split("\n    at Script.runInThisContext")[0],
    });
  } finally {
    for (const k of Object.keys(saved)) {
      if (saved[k] === undefined) delete process.env[k];
      else process.env[k] = saved[k];
    }
  }
  send({ type: "end", n: req.n, count });
}

let pending = "";
const queue = [];
let busy = false;
async function drain() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    await turn(queue.shift());
  }
  busy = false;
}
const requests = fs.createReadStream(null, { fd: R, encoding: "utf8" });
requests.on("data", (chunk) => {
  pending += chunk;
  let at;
  while ((at = pending.indexOf("\n")) >= 0) {
    const line = pending.slice(0, at);
    pending = pending.slice(at + 1);
    try {
      queue.push(JSON.parse(line));
    } catch (_) {
      continue;
    }
  }
  drain();
});
requests.on("end", () => process.exit(0));
send({ type: "ready" });
})();
