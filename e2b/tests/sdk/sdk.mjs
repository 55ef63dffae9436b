// Paddock's E2B-compatible API, driven through E2B's own JavaScript SDK.
//
// Run by `e2b/tests/all/sdk.rs` with node against a live node (what `paddock serve --e2b` runs):
// `node sdk.mjs <the directory npm installed e2b in>`, with E2B_API_URL and E2B_SANDBOX_URL set to
// its URL, ALICE_KEY and BOB_KEY two tenants' API keys, PADDOCK_ENGINE the engine.
// Every check prints `ok NAME`; the Rust test requires every name of CHECKS.
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.argv[2], "package.json"));
const { Sandbox, CommandExitError, NotFoundError, AuthenticationError, FilesystemEventType } =
  require("e2b");

const ALICE = process.env.ALICE_KEY;
const BOB = process.env.BOB_KEY;
const URL_ = process.env.E2B_API_URL;

function check(cond, what) {
  if (!cond) throw new Error(what);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function snippet() {
  const sbx = await Sandbox.create({ apiKey: ALICE });
  try {
    const r = await sbx.commands.run("echo hi");
    check(r.stdout === "hi\n" && r.exitCode === 0, `echo: ${JSON.stringify(r)}`);
    await sbx.files.write("/home/user/a.txt", "x");
    check((await sbx.files.read("/home/user/a.txt")) === "x", "read back");
    const h = await sbx.commands.run("sleep 30", { background: true });
    check((await h.kill()) === true, "kill");
  } finally {
    await sbx.kill();
  }
  check(!(await sbx.isRunning()), "not running after kill");
}

async function commands() {
  const sbx = await Sandbox.create({ apiKey: ALICE });
  try {
    let r = await sbx.commands.run("pwd; echo $G >&2", { envs: { G: "hello" } });
    check(r.stdout === "/home/user\n" && r.stderr === "hello\n", `env: ${JSON.stringify(r)}`);
    try {
      await sbx.commands.run("echo out; exit 4");
      throw new Error("exit 4 throws");
    } catch (e) {
      check(e instanceof CommandExitError && e.exitCode === 4 && e.stdout === "out\n", `exit: ${e}`);
    }
    await sbx.commands.run("mkdir -p sub");
    r = await sbx.commands.run("pwd", { cwd: "/home/user/sub" });
    check(r.stdout === "/home/user/sub\n", `cwd: ${r.stdout}`);
    const cat = await sbx.commands.run("cat", { background: true, stdin: true });
    await sbx.commands.sendStdin(cat.pid, "abc\n");
    await sbx.commands.closeStdin(cat.pid);
    r = await cat.wait();
    check(r.stdout === "abc\n", `stdin: ${r.stdout}`);
    const bg = await sbx.commands.run("for i in 1 2 3; do echo l$i; sleep 0.3; done", { background: true });
    const listed = (await sbx.commands.list()).map((p) => p.pid);
    check(listed.includes(bg.pid), `list: ${listed}`);
    const again = await sbx.commands.connect(bg.pid);
    r = await again.wait();
    check(r.stdout.includes("l3\n"), `connect: ${r.stdout}`);
    check((await sbx.commands.kill(987654)) === false, "kill unknown");
  } finally {
    await sbx.kill();
  }
}

async function files() {
  const sbx = await Sandbox.create({ apiKey: ALICE });
  try {
    const bytes = new Uint8Array(70000).map((_, i) => i % 256);
    await sbx.files.write("/home/user/b.bin", bytes.buffer);
    const back = await sbx.files.read("/home/user/b.bin", { format: "bytes" });
    check(back.length === bytes.length && back.every((v, i) => v === bytes[i]), "bytes");
    await sbx.files.write([
      { path: "/home/user/m/one.txt", data: "1" },
      { path: "/home/user/m/two.txt", data: "2" },
    ]);
    const names = (await sbx.files.list("/home/user/m")).map((e) => e.name).sort();
    check(JSON.stringify(names) === '["one.txt","two.txt"]', `list: ${names}`);
    check(await sbx.files.exists("/home/user/m/one.txt"), "exists");
    check(!(await sbx.files.exists("/home/user/nope")), "not exists");
    check((await sbx.files.makeDir("/home/user/d")) === true, "makeDir");
    check((await sbx.files.makeDir("/home/user/d")) === false, "makeDir again");
    const moved = await sbx.files.rename("/home/user/m/one.txt", "/home/user/d/one.txt");
    check(moved.path === "/home/user/d/one.txt", `rename: ${JSON.stringify(moved)}`);
    await sbx.files.remove("/home/user/d");
    check(!(await sbx.files.exists("/home/user/d")), "removed");
    try {
      await sbx.files.read("/home/user/missing.txt");
      throw new Error("a missing file throws");
    } catch (e) {
      check(e instanceof NotFoundError || e.name === "FileNotFoundError", `missing: ${e}`);
    }
  } finally {
    await sbx.kill();
  }
}

async function pty() {
  const sbx = await Sandbox.create({ apiKey: ALICE });
  try {
    let got = "";
    const t = await sbx.pty.create({
      cols: 80,
      rows: 24,
      onData: (d) => {
        got += Buffer.from(d).toString();
      },
    });
    await sbx.pty.resize(t.pid, { cols: 132, rows: 40 });
    await sbx.pty.sendInput(t.pid, new TextEncoder().encode("echo cols=$(tput cols 2>/dev/null || stty size | cut -d' ' -f2)\n"));
    const deadline = Date.now() + 15000;
    while (!got.includes("cols=132") && Date.now() < deadline) await sleep(100);
    check(got.includes("cols=132"), `pty: ${got.slice(-200)}`);
    check((await sbx.pty.kill(t.pid)) === true, "pty kill");
  } finally {
    await sbx.kill();
  }
}

async function watch() {
  const sbx = await Sandbox.create({ apiKey: ALICE });
  try {
    await sbx.files.makeDir("/home/user/w");
    const seen = [];
    const h = await sbx.files.watchDir("/home/user/w", (e) => seen.push([e.name, e.type]));
    await sbx.files.write("/home/user/w/new.txt", "n");
    const deadline = Date.now() + 10000;
    while (!seen.some(([n, t]) => n === "new.txt" && t === FilesystemEventType.CREATE) && Date.now() < deadline) {
      await sleep(100);
    }
    await h.stop();
    check(seen.some(([n, t]) => n === "new.txt" && t === FilesystemEventType.CREATE), `watch: ${JSON.stringify(seen)}`);
  } finally {
    await sbx.kill();
  }
}

async function lifecycle() {
  const a = await Sandbox.create({ apiKey: ALICE, metadata: { js: "1" } });
  try {
    const found = await Sandbox.list({ apiKey: ALICE, query: { metadata: { js: "1" } } }).nextItems();
    check(found.length === 1 && found[0].sandboxId === a.sandboxId, `list: ${JSON.stringify(found)}`);
    const info = await a.getInfo();
    check(info.state === "running" && info.metadata.js === "1", `info: ${JSON.stringify(info)}`);
    await a.setTimeout(1000);
    const deadline = Date.now() + 10000;
    while ((await a.isRunning()) && Date.now() < deadline) await sleep(200);
    check(!(await a.isRunning()), "ended after its timeout");
  } finally {
    await Sandbox.kill(a.sandboxId, { apiKey: ALICE });
  }
}

async function tenants() {
  try {
    await Sandbox.create({ apiKey: "not-a-key-of-this-server" });
    throw new Error("a wrong key is refused");
  } catch (e) {
    check(e instanceof AuthenticationError, `wrong key: ${e}`);
  }
  const mine = await Sandbox.create({ apiKey: ALICE });
  try {
    try {
      await Sandbox.connect(mine.sandboxId, { apiKey: BOB });
      throw new Error("bob cannot connect to alice's sandbox");
    } catch (e) {
      check(e instanceof NotFoundError || e.name === "SandboxNotFoundError", `bob connect: ${e}`);
    }
    check((await Sandbox.kill(mine.sandboxId, { apiKey: BOB })) === false, "bob cannot kill it");
    const listed = (await Sandbox.list({ apiKey: BOB }).nextItems()).map((s) => s.sandboxId);
    check(!listed.includes(mine.sandboxId), `bob's list: ${listed}`);
  } finally {
    await mine.kill();
  }
}

async function ports() {
  const sbx = await Sandbox.create({ apiKey: ALICE });
  try {
    await sbx.files.write("/home/user/site/i.txt", "from js");
    await sbx.commands.run("exec python3 -m http.server 8001 --bind 127.0.0.1 --directory /home/user/site", {
      background: true,
    });
    const host = sbx.getHost(8001);
    let text = "";
    const deadline = Date.now() + 15000;
    while (Date.now() < deadline) {
      // A private sandbox (the default): its ports take its traffic token.
      const r = await fetch(`${URL_}/i.txt`, {
        headers: {
          "E2b-Sandbox-Id": sbx.sandboxId,
          "E2b-Sandbox-Port": "8001",
          "E2B-Traffic-Access-Token": sbx.trafficAccessToken,
        },
      });
      if (r.status === 200) {
        text = await r.text();
        break;
      }
      await sleep(200);
    }
    check(host === `8001-${sbx.sandboxId}.e2b.test` && text === "from js", `ports: ${host} ${text}`);
    const stranger = await fetch(`${URL_}/i.txt`, {
      headers: { "E2b-Sandbox-Id": sbx.sandboxId, "E2b-Sandbox-Port": "8001" },
    });
    check(stranger.status === 502, `without the traffic token: ${stranger.status}`);
  } finally {
    await sbx.kill();
  }
}

const CHECKS = { snippet, commands, files, pty, watch, lifecycle, tenants, ports };
let failed = 0;
for (const [name, f] of Object.entries(CHECKS)) {
  try {
    await f();
    console.log(`ok ${name}`);
  } catch (e) {
    failed += 1;
    console.log(`FAILED ${name}`);
    console.error(e);
  }
}
process.exit(failed ? 1 : 0);
