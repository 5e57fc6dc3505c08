'use strict';
// Kiln's sandbox launcher for Node.js: the image entrypoint that waits for
// one job and runs it, speaking the launcher protocol
// (sandbox/initproto; deploy/images/python/kilnproto.py is the Python
// launchers' side, sandbox/initproto/testdata the vectors every side's
// tests read):
//
//     KILN/<major>.<minor> <n>\n
//     <n bytes of JSON: {"code": str, "args": [str], "env": {str: str},
//                        "files": [{"name": str, "data": base64}]}>
//     <the job's own stdin bytes, until EOF>
//
// A header of another major version than PROTOCOL_MAJOR is refused: the
// image and the worker are of different releases. A newer minor of the same
// major is read.
//
// The frame is read with fs.readSync on fd 0, byte-exact, so the program's
// process.stdin continues right after it. The launcher writes the input
// files and the program, then hands the program to node's own loader as the
// main module (Module.runMain), exactly as `node main.js` would run it: the
// loader reads the file's bytes (a BOM is stripped as node does), require.main
// is the program's module, and an uncaught error is reported and exits 1 the
// way node reports it.
//
// CommonJS or ES module: the program is main.js (CommonJS, what most
// programs written for a code interpreter are: require() and
// console.log). A program that only parses as an ES module (import/export
// statements, top-level await) is written as main.mjs instead, so it runs as
// node would run it had it been saved with that name, the same choice node
// 22 makes by default ("--experimental-detect-module").
//
// The V8 heap is bounded by --max-old-space-size, which the worker sets from
// the job's memory limit (runtime.json's interpreter_flags).
//
// The exception (the Kiln output channel): when KILN_OUTPUT_FD names a
// descriptor (kiln-init passes one), an uncaught error is written to it as
// one JSON line, {"exception": {type, message, line, column, source_line,
// frames}}, before node reports it on stderr as usual; the frames are the
// program's own (files under /work). Nothing is ever read from stdout.
//
// Exit codes: the program's own; 1 for an uncaught error (node's); 125 for a
// frame it cannot read or a protocol version it does not speak, the
// platform's fault, flagged on stderr with "kiln-launcher:".
//
// Started with KILN_SESSION_FD set, it is a session's interpreter instead
// (session.js). Required as a module (its tests, session.js), it runs
// nothing and exports its parts.

const fs = require('fs');
const Module = require('module');
const vm = require('vm');

const WORKDIR = '/work';
const MAIN = 'main.js';
const MAIN_ESM = 'main.mjs';
const PROTOCOL_MAJOR = 2;
const PROTOCOL = '2.0';
const MAGIC = 'KILN/';
const MAX_HEADER = 64;
const MAX_FRAME = 64 << 20;
const LAUNCH_ERROR = 125;
// Names the file descriptor the runtime reads "set up, about to run" from.
const READY_FD_ENV = 'KILN_READY_FD';

function fail(msg) {
  try {
    fs.writeSync(2, 'kiln-launcher: ' + msg + '\n');
  } finally {
    process.reallyExit(LAUNCH_ERROR);
  }
}

// readSome reads up to len bytes from fd 0 into buf at off; 0 at end of file.
function readSome(buf, off, len) {
  for (;;) {
    try {
      return fs.readSync(0, buf, off, len, null);
    } catch (e) {
      if (e.code === 'EAGAIN') {
        // A non-blocking pipe: wait a moment instead of spinning.
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
        continue;
      }
      if (e.code === 'EOF') return 0;
      throw e;
    }
  }
}

// ProtocolError is what the worker sent that this launcher does not read.
class ProtocolError extends Error {}

// checkVersion refuses a protocol version of another major.
function checkVersion(version) {
  const major = version.split('.')[0];
  if (!/^[0-9]+$/.test(major) || Number(major) !== PROTOCOL_MAJOR) {
    throw new ProtocolError(
      'the worker speaks launcher protocol ' + (version || '(none)') + ', this launcher ' + PROTOCOL +
        ": the image and the worker are of different releases (rebuild the image, or run a worker of the image's release)",
    );
  }
}

// parseHeader returns the length a header line (without its newline)
// announces.
function parseHeader(line) {
  if (!line.startsWith(MAGIC)) throw new ProtocolError('job header does not start with ' + MAGIC);
  const rest = line.slice(MAGIC.length);
  const sp = rest.indexOf(' ');
  checkVersion(sp < 0 ? rest : rest.slice(0, sp));
  const digits = sp < 0 ? '' : rest.slice(sp + 1).replace(/ +$/, '');
  if (!/^[0-9]+$/.test(digits)) throw new ProtocolError('job header has no valid length');
  const n = Number(digits);
  if (n > MAX_FRAME) throw new ProtocolError('job frame length ' + n + ' is out of range');
  return n;
}

function readHeader() {
  // Byte by byte: reading further would eat the start of the job's stdin.
  const one = Buffer.alloc(1);
  let line = '';
  for (;;) {
    if (readSome(one, 0, 1) === 0) throw new ProtocolError('stdin closed before a job header arrived');
    if (one[0] === 0x0a) break;
    line += String.fromCharCode(one[0]);
    if (line.length > MAX_HEADER) throw new ProtocolError('job header is too long');
  }
  return parseHeader(line);
}

function readExact(n) {
  const buf = Buffer.alloc(n);
  let off = 0;
  while (off < n) {
    const got = readSome(buf, off, Math.min(n - off, 1 << 20));
    if (got === 0) throw new ProtocolError('stdin closed before the job frame was complete');
    off += got;
  }
  return buf;
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

// parseFrame reads the frame's JSON body.
function parseFrame(raw) {
  let job;
  try {
    job = JSON.parse(raw.toString('utf8'));
  } catch (e) {
    throw new ProtocolError('job frame is not valid: ' + e.message);
  }
  if (job === null || typeof job !== 'object' || Array.isArray(job)) throw new ProtocolError('job frame is not valid: not a JSON object');
  if (typeof job.code !== 'string') throw new ProtocolError('job frame: code is not a string');
  const args = (job.args || []).map(String);
  const env = {};
  for (const [k, v] of Object.entries(job.env || {})) env[k] = String(v);
  const files = (job.files || []).map((f) => {
    const data = f.data || '';
    if (typeof f.name !== 'string' || typeof data !== 'string' || !BASE64.test(data)) {
      throw new ProtocolError('job frame is not valid: file ' + JSON.stringify(f.name) + ' has no valid name or base64 data');
    }
    return [f.name, Buffer.from(data, 'base64')];
  });
  return { code: job.code, args, env, files };
}

// createFile writes WORKDIR/name without following a symbolic link: the
// work dir is a fresh tmpfs that only this process has written to, every
// directory on the way is checked to be a real directory, and the file is
// created with O_EXCL|O_NOFOLLOW, so an existing entry is an error.
function createFile(name, data) {
  const parts = name.split('/');
  if (name.startsWith('/') || parts.some((p) => p === '' || p === '.' || p === '..')) {
    fail('file name ' + JSON.stringify(name) + ' is not a safe relative path');
  }
  let dir = WORKDIR;
  for (const part of parts.slice(0, -1)) {
    dir += '/' + part;
    try {
      fs.mkdirSync(dir, 0o755);
    } catch (e) {
      if (e.code !== 'EEXIST') throw e;
    }
    if (!fs.lstatSync(dir).isDirectory()) fail('input file path ' + JSON.stringify(name) + ' crosses a non-directory');
  }
  const c = fs.constants;
  const fd = fs.openSync(dir + '/' + parts[parts.length - 1], c.O_WRONLY | c.O_CREAT | c.O_EXCL | c.O_NOFOLLOW, 0o644);
  try {
    let off = 0;
    while (off < data.length) off += fs.writeSync(fd, data, off, data.length - off);
  } finally {
    fs.closeSync(fd);
  }
}

// The messages V8 gives for syntax only an ES module may use.
const ESM_ONLY = [
  'Cannot use import statement outside a module',
  "Unexpected token 'export'",
  "Cannot use 'import.meta' outside a module",
  'await is only valid in async functions and the top level bodies of modules',
];

// isModuleOnly says whether code fails to compile as CommonJS (the function
// node's loader wraps a .js file in) for a reason only an ES module has.
function isModuleOnly(code) {
  try {
    vm.compileFunction(code.charCodeAt(0) === 0xfeff ? code.slice(1) : code, ['exports', 'require', 'module', '__filename', '__dirname'], {
      filename: WORKDIR + '/' + MAIN,
    });
    return false;
  } catch (e) {
    return e instanceof SyntaxError && ESM_ONLY.some((m) => e.message.includes(m));
  }
}

// signalReady tells the runtime the job is set up and the program is about
// to run: one byte on the descriptor READY_FD_ENV names, then closed.
function signalReady() {
  const v = process.env[READY_FD_ENV];
  if (v === undefined) return;
  delete process.env[READY_FD_ENV];
  try {
    const fd = Number(v);
    fs.writeSync(fd, '1');
    fs.closeSync(fd);
  } catch (e) {
    fail('readiness descriptor ' + JSON.stringify(v) + ': ' + e.message);
  }
}

const OUTPUT_FD_ENV = 'KILN_OUTPUT_FD';
const FRAME_RE = /^\s*at (?:(.*?) \()?(?:file:\/\/)?(\/work\/[^():]+):(\d+):(\d+)\)?$/;

// exceptionRecord describes an uncaught value as job.Exception.
function exceptionRecord(err) {
  const rec = {};
  if (err instanceof Error || (err !== null && typeof err === 'object' && typeof err.stack === 'string')) {
    rec.type = String(err.name || (err.constructor && err.constructor.name) || 'Error');
    rec.message = String(err.message === undefined ? '' : err.message);
  } else {
    rec.type = err === null ? 'null' : typeof err;
    rec.message = String(err);
  }
  const stack = typeof (err && err.stack) === 'string' ? err.stack : '';
  if (rec.type === 'SyntaxError') {
    // A program that does not compile: the loader's stack starts with
    // "/work/main.js:LINE", the line, and a caret under the column.
    const m = /^(?:file:\/\/)?(\/work\/[^\n:]+):(\d+)\n(.*)\n( *)\^/.exec(stack);
    if (m) {
      rec.line = Number(m[2]);
      rec.column = m[4].length + 1;
      rec.source_line = m[3].trim();
    }
  }
  const frames = [];
  for (const l of stack.split('\n')) {
    const m = FRAME_RE.exec(l);
    if (m) frames.push({ file: m[2], line: Number(m[3]), function: m[1] || '<module>' });
  }
  if (frames.length) {
    frames.reverse(); // outermost first, as Python's
    rec.frames = frames.slice(-32);
    if (rec.line === undefined) {
      const top = frames[frames.length - 1];
      rec.line = top.line;
      try {
        rec.source_line = fs.readFileSync(top.file, 'utf8').split('\n')[top.line - 1].trim();
      } catch (e) {
        // the program removed its own file: no source line
      }
    }
  }
  return rec;
}

// watchExceptions writes the uncaught error to the output channel; node
// then reports it and exits as it always does.
function watchExceptions() {
  const v = process.env[OUTPUT_FD_ENV];
  delete process.env[OUTPUT_FD_ENV];
  if (v === undefined || !/^[0-9]+$/.test(v)) return;
  const fd = Number(v);
  process.on('uncaughtExceptionMonitor', (err) => {
    try {
      fs.writeSync(fd, JSON.stringify({ exception: exceptionRecord(err) }) + '\n');
    } catch (e) {
      // the channel is gone: node's own report on stderr still says it
    }
  });
}

// useEgressProxy sends fetch() through the job's egress proxy
// (KILN_EGRESS_PROXY, set only for a job with a network): node's fetch does
// not read HTTPS_PROXY. Every connection fetch opens becomes a CONNECT
// tunnel to the proxy, TLS inside it for https. (http.request and other
// clients take the proxy from the *_PROXY variables as their libraries do.)
function useEgressProxy() {
  const proxy = process.env.KILN_EGRESS_PROXY;
  if (!proxy || typeof fetch !== 'function') return;
  const net = require('net');
  const tls = require('tls');
  const p = new URL(proxy);
  const sym = Symbol.for('undici.globalDispatcher.1');
  fetch('data:,').catch(() => {}); // loads node's undici and its global agent
  const current = globalThis[sym];
  if (!current) return;
  const Agent = current.constructor;
  const connect = (opts, cb) => {
    const https = opts.protocol === 'https:';
    const port = opts.port || (https ? 443 : 80);
    const target = `${opts.hostname}:${port}`;
    const s = net.connect(Number(p.port), p.hostname);
    let head = Buffer.alloc(0);
    let done = false;
    const finish = (err, sock) => {
      if (done) return;
      done = true;
      cb(err, sock);
    };
    s.once('error', (e) => finish(e));
    s.once('connect', () => s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`));
    const onData = (d) => {
      head = Buffer.concat([head, d]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      s.removeListener('data', onData);
      const text = head.toString('latin1');
      const status = Number(text.split(' ')[1]);
      if (status !== 200) {
        // The proxy says why in a short body, then closes.
        let body = head.subarray(end + 4);
        s.on('data', (more) => { body = Buffer.concat([body, more]).subarray(0, 1024); });
        s.once('close', () => {
          const why = body.toString('utf8').trim() || text.split('\r\n')[0];
          finish(new Error(`egress proxy refused ${target} (HTTP ${status}): ${why}`));
        });
        return;
      }
      if (!https) return finish(null, s);
      const t = tls.connect({ socket: s, servername: opts.servername || opts.hostname, ALPNProtocols: ['http/1.1'] });
      t.once('secureConnect', () => finish(null, t));
      t.once('error', (e) => finish(e));
    };
    s.on('data', onData);
  };
  globalThis[sym] = new Agent({ connect });
}

function main() {
  let job;
  try {
    job = parseFrame(readExact(readHeader()));
  } catch (e) {
    if (e instanceof ProtocolError) fail(e.message);
    throw e;
  }
  const main = isModuleOnly(job.code) ? MAIN_ESM : MAIN;
  try {
    for (const [name, data] of job.files) createFile(name, data);
    createFile(main, Buffer.from(job.code, 'utf8'));
  } catch (e) {
    fail('writing input files: ' + e.message);
  }
  const path = WORKDIR + '/' + main;
  process.argv = [process.argv[0], path, ...job.args];
  Object.assign(process.env, job.env);
  useEgressProxy();
  watchExceptions();
  signalReady();
  Module.runMain(path);
}

module.exports = { PROTOCOL, PROTOCOL_MAJOR, LAUNCH_ERROR, ProtocolError, parseHeader, parseFrame, exceptionRecord };
if (require.main === module) {
  if (process.env.KILN_SESSION_FD !== undefined) {
    // A session's interpreter (session.js), started by the session relay.
    require('./session.js').serve();
  } else {
    main();
  }
}
