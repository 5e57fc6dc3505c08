'use strict';
// Tests of the Node launcher's protocol side (deploy/images/node/launch.js)
// against the shared vectors in sandbox/initproto/testdata, which the
// worker's tests read too. Run by sandbox/initproto's Go tests (make test):
//
//     node --test deploy/images/tests/

const test = require('node:test');
const assert = require('node:assert');
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');

const LAUNCHER = path.join(__dirname, '..', 'node', 'launch.js');
const VECTORS = path.join(__dirname, '..', '..', '..', 'sandbox', 'initproto', 'testdata');
const launch = require(LAUNCHER);

const frames = JSON.parse(fs.readFileSync(path.join(VECTORS, 'frames.json'), 'utf8'));

test('valid frames read as the worker meant them', () => {
  assert.ok(frames.valid.length >= 3);
  for (const v of frames.valid) {
    const raw = Buffer.from(v.frame, 'utf8');
    const nl = raw.indexOf(0x0a);
    const n = launch.parseHeader(raw.subarray(0, nl).toString('latin1'));
    assert.strictEqual(n, raw.length - nl - 1, v.name);
    const job = launch.parseFrame(raw.subarray(nl + 1));
    assert.strictEqual(job.code, v.want.code, v.name);
    assert.deepStrictEqual(job.args, v.want.args, v.name);
    assert.deepStrictEqual(job.env, v.want.env, v.name);
    assert.deepStrictEqual(
      job.files.map(([name, data]) => ({ name, data: data.toString('base64') })),
      v.want.files,
      v.name,
    );
  }
});

test('invalid frames are refused by the launcher with exit code 125 and a kiln-launcher: line', () => {
  assert.ok(frames.invalid.length >= 10);
  for (const v of frames.invalid) {
    const p = spawnSync(process.execPath, [LAUNCHER], {
      input: Buffer.from(v.frame, 'utf8'),
      env: { PATH: process.env.PATH || '/usr/bin:/bin' },
      timeout: 60_000,
    });
    assert.strictEqual(p.status, launch.LAUNCH_ERROR, v.name + ': ' + p.stderr);
    const lines = p.stderr.toString().trim().split('\n');
    const last = lines[lines.length - 1];
    assert.ok(last.startsWith('kiln-launcher: '), v.name + ': ' + last);
    assert.ok(last.includes(v.error), v.name + ': ' + last + ' does not say ' + v.error);
  }
});

test('the launcher speaks the protocol the vectors are of', () => {
  const major = String(launch.PROTOCOL_MAJOR);
  assert.strictEqual(launch.PROTOCOL.split('.')[0], major);
  assert.ok(frames.valid.every((v) => v.frame.startsWith('KILN/' + major + '.')));
});
