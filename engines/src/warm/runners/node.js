// Paddock's warm Node runner: json-stdio v1 on fd 0 (frames in) and fd 3 (frames out).
// The snippet's own stdout and stderr stay on fd 1 and 2, which the host captures as
// they are, so nothing a snippet prints can be mistaken for a frame.
//
// invoke input: {"code": "<source>"} runs a snippet in a fresh context (a new global
// object with console, require, process, timers and Buffer); its value is the
// snippet's completion value, awaited when it is a promise. The turn ends like a
// process would: an `output` frame whose output is {"exit_code": 0, "value": <json>}
// on success, {"exit_code": 1} after an uncaught error (its stack on stderr),
// {"exit_code": n} after process.exit(n).
//
// The host cancels a turn by writing a `cancel` frame and sending the runner SIGINT:
// a running script is interrupted (vm's breakOnSigint), an awaited one abandoned, and
// the turn ends with an error frame of code CANCELLED. Closing stdin shuts it down.
'use strict';

const fs = require('fs');
const vm = require('vm');
const readline = require('readline');

function send(frame) {
  fs.writeSync(3, JSON.stringify(Object.assign({ v: 1 }, frame)) + '\n');
}

function toJson(value) {
  if (value === undefined) return undefined;
  try {
    const text = JSON.stringify(value);
    if (text !== undefined) return JSON.parse(text);
  } catch (_) { /* not JSON: the string form below */ }
  try { return String(value); } catch (_) { return Object.prototype.toString.call(value); }
}

class ExitRequest {
  constructor(code) { this.code = code; }
}

let cancelTurn = null;
process.on('SIGINT', () => { if (cancelTurn) cancelTurn(); });

function printError(err) {
  // The snippet's frames, not the runner's.
  const text = (err && err.stack ? err.stack : String(err))
    .split('\n')
    .filter((l) => !l.includes(__filename) && !l.includes('(node:vm:') && !l.includes('(node:internal/'))
    .join('\n');
  try { process.stderr.write(text + '\n'); } catch (_) { /* stderr gone */ }
}

function makeContext() {
  const proc = Object.create(process, {
    exit: { value: (code) => { throw new ExitRequest(code === undefined ? 0 : code); } },
  });
  return vm.createContext({
    console, require, process: proc, Buffer, URL, TextEncoder, TextDecoder,
    setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate,
    queueMicrotask, structuredClone,
  });
}

// The next snippet's context, made while the runner waits (no snippet has seen it).
let spare = null;
function prepare() {
  if (!spare) spare = makeContext();
}

async function runCode(source) {
  const context = spare || makeContext();
  spare = null;
  const script = new vm.Script(source, { filename: '<snippet>' });
  let value = script.runInContext(context, { breakOnSigint: true });
  if (value && typeof value.then === 'function') {
    value = await Promise.race([
      value,
      new Promise((_, reject) => { cancelTurn = () => reject(new Error('Script execution was interrupted by `SIGINT`')); }),
    ]);
  }
  return value;
}

async function handle(frame) {
  const id = frame.id;
  const input = frame.input || {};
  let reply;
  let interrupted = false;
  cancelTurn = () => { interrupted = true; };
  try {
    if (typeof input.code !== 'string') throw new TypeError('input must hold `code`');
    const value = await runCode(input.code);
    reply = { kind: 'output', id, output: { exit_code: 0, value: toJson(value) } };
  } catch (err) {
    if (err instanceof ExitRequest) {
      const code = Number.isInteger(err.code) ? err.code & 0xff : 1;
      reply = { kind: 'output', id, output: { exit_code: code } };
    } else if (interrupted || (err && /interrupted by `SIGINT`/.test(err.message))) {
      reply = { kind: 'error', id, error: { code: 'CANCELLED', message: 'cancelled' } };
    } else {
      printError(err);
      reply = { kind: 'output', id, output: { exit_code: 1 } };
    }
  } finally {
    cancelTurn = null;
  }
  send(reply);
  setImmediate(prepare);
}

// What a turn goes through for the first time (the output streams, a context, a
// script run with a SIGINT watchdog) is done once here, before any snippet, so that
// the first one costs what the others do.
// Nothing is written: output before a turn would be taken for the turn's.
process.stdout;
process.stderr;
new vm.Script('undefined', { filename: '<warm-up>' }).runInContext(vm.createContext({}), { breakOnSigint: true });
new console.Console(new (require('stream').Writable)({ write(chunk, encoding, done) { done(); } })).log('%s %j', 1, { a: 1 });
JSON.parse(JSON.stringify({ v: 1, kind: 'output', id: '', output: { exit_code: 0 } }));
toJson(1);
Promise.race([Promise.resolve()]);
prepare();

const lines = readline.createInterface({ input: fs.createReadStream(null, { fd: 0 }), crlfDelay: Infinity });
let chain = Promise.resolve();
lines.on('line', (line) => {
  if (!line.trim()) return;
  let frame;
  try {
    frame = JSON.parse(line);
  } catch (_) {
    process.stderr.write('paddock runner: unreadable frame\n');
    process.exit(3);
  }
  if (frame.v !== 1) {
    process.stderr.write('paddock runner: unsupported protocol version\n');
    process.exit(3);
  }
  if (frame.kind === 'cancel') return;
  if (frame.kind !== 'invoke') {
    send({ kind: 'error', id: frame.id || '?', error: { code: 'PROTOCOL_ERROR', message: 'this runner takes invoke and cancel frames' } });
    return;
  }
  chain = chain.then(() => handle(frame));
});
lines.on('close', () => { chain.then(() => process.exit(0)); });
