'use strict';
// JavaScript peers of `paddock bench isolate`, run by `peers.rs` with node.
//
// Usage: node isolate_peers.js <mode> <iterations> <scenario> [node_modules dir]
//
//   mode       `vm`  : vm.runInNewContext per operation, in this warm process;
//              `ivm` : a fresh isolated-vm Isolate per operation (create, context,
//                      eval, dispose). isolated-vm is loaded from the node_modules
//                      directory in argv[5], or else $PADDOCK_ISOLATED_VM_NODE_MODULES.
//   scenario   `one_plus_one` (`1+1`) or `loop` (a 10,000-step summing loop).
//
// Prints one JSON line on stdout. Exits 2 on bad usage, 3 when isolated-vm cannot be
// loaded and 4 when an operation returns a wrong value.

const path = require('path');
const vm = require('vm');

const SCENARIOS = {
  one_plus_one: { code: '1+1', expected: 2 },
  loop: { code: 'let s=0; for (let i=0;i<10000;i++) s+=i; s', expected: 49995000 },
};
const IVM_MEMORY_LIMIT_MIB = 32;

function fail(code, message) {
  process.stderr.write(`isolate_peers: ${message}\n`);
  process.exit(code);
}

const [mode, iterationsArg, scenarioName, modulesArg] = process.argv.slice(2);
const usage = 'usage: isolate_peers.js <vm|ivm> <iterations> <one_plus_one|loop> [node_modules dir]';
if (mode !== 'vm' && mode !== 'ivm') fail(2, `unknown mode ${JSON.stringify(mode)}; ${usage}`);
const scenario = Object.prototype.hasOwnProperty.call(SCENARIOS, scenarioName)
  ? SCENARIOS[scenarioName]
  : fail(2, `unknown scenario ${JSON.stringify(scenarioName)}; ${usage}`);
const iterations = Number(iterationsArg);
if (!Number.isSafeInteger(iterations) || iterations < 1) {
  fail(2, `iterations must be a positive integer, got ${JSON.stringify(iterationsArg)}; ${usage}`);
}

let op;
let ivmVersion;
if (mode === 'vm') {
  op = () => vm.runInNewContext(scenario.code);
} else {
  const modules = modulesArg || process.env.PADDOCK_ISOLATED_VM_NODE_MODULES;
  if (!modules) {
    fail(2, 'mode ivm needs the node_modules directory holding isolated-vm, as the 4th '
      + 'argument or in $PADDOCK_ISOLATED_VM_NODE_MODULES');
  }
  const dir = path.resolve(modules, 'isolated-vm');
  let ivm;
  try {
    ivm = require(dir);
    ivmVersion = require(path.join(dir, 'package.json')).version;
  } catch (e) {
    fail(3, `cannot load isolated-vm from ${dir} (install it there with npm, and run node `
      + `20+ with --no-node-snapshot): ${e && e.message}`);
  }
  op = () => {
    const isolate = new ivm.Isolate({ memoryLimit: IVM_MEMORY_LIMIT_MIB });
    try {
      const context = isolate.createContextSync();
      return context.evalSync(scenario.code);
    } finally {
      isolate.dispose();
    }
  };
}

function checked() {
  const value = op();
  if (value !== scenario.expected) {
    fail(4, `${mode} ${scenarioName} returned ${JSON.stringify(value)}, `
      + `expected ${scenario.expected}`);
  }
}

const warmup = Math.max(20, Math.ceil(iterations / 10));
for (let i = 0; i < warmup; i++) checked();

const samples = new Float64Array(iterations);
for (let i = 0; i < iterations; i++) {
  const start = process.hrtime.bigint();
  checked();
  samples[i] = Number(process.hrtime.bigint() - start) / 1e3;
}
samples.sort();
// The same rank rule as the Rust side's `summarize`.
const at = (q) => samples[Math.round((samples.length - 1) * q)];
const round3 = (v) => Math.round(v * 1e3) / 1e3;

const out = {
  mode,
  scenario: scenarioName,
  iterations,
  warmup,
  p50_us: round3(at(0.5)),
  p99_us: round3(at(0.99)),
  min_us: round3(samples[0]),
  max_us: round3(samples[samples.length - 1]),
  node: process.version,
  v8: process.versions.v8,
};
if (mode === 'ivm') {
  out.ivm_version = ivmVersion;
  out.ivm_memory_limit_mib = IVM_MEMORY_LIMIT_MIB;
}
process.stdout.write(`${JSON.stringify(out)}\n`);
