#!/usr/bin/env node
// A json-stdio v1 handler in JavaScript (docs/protocol.md): sums `input.numbers`.
// Frames come in on stdin and go out on stdout, one JSON object a line; diagnostics go
// to stderr. It stays alive between invocations, so Paddock can keep it warm:
//
//   [subprocess.handlers.sum]
//   command = ["node", "/path/to/sum.js"]
//
// and then `{"handler": "sum", "input": {"numbers": [1, 2, 3.5]}}` returns 6.5.
'use strict';

const readline = require('readline');

function send(frame) {
  process.stdout.write(JSON.stringify(Object.assign({ v: 1 }, frame)) + '\n');
}

readline.createInterface({ input: process.stdin, crlfDelay: Infinity }).on('line', (line) => {
  if (!line.trim()) return;
  let frame;
  try {
    frame = JSON.parse(line);
  } catch (_) {
    process.stderr.write('sum: unreadable frame\n');
    process.exit(3);
  }
  if (frame.v !== 1) {
    process.stderr.write('sum: this handler speaks protocol v1 only\n');
    process.exit(3);
  }
  if (frame.kind !== 'invoke') return; // a cancel between turns: nothing to stop
  const numbers = frame.input && frame.input.numbers;
  if (!Array.isArray(numbers) || !numbers.every((n) => typeof n === 'number')) {
    send({ kind: 'error', id: frame.id, error: { code: 'BAD_INPUT', message: 'input.numbers must be a list of numbers' } });
    return;
  }
  send({ kind: 'log', id: frame.id, stream: 'stderr', data: `summing ${numbers.length} numbers\n` });
  send({ kind: 'output', id: frame.id, output: numbers.reduce((a, b) => a + b, 0) });
});
