'use strict';
// Kiln's session interpreter for Node.js: one node process kept for a
// session's life, so globalThis, required modules, timers and the files in
// /work persist from call to call (sandbox/session.go is the worker's side).
//
// The session's box is supervised by the python box supervisor this image
// carries (deploy/images/python/box.py, session.py): it makes the session's
// inner sandbox, and its relay (relay.py), running as the session's uid
// under the same sandbox, starts this process with:
//
//     fd 3 (KILN_SESSION_FD): a socket; each call arrives as one JSON line
//         {"code", "args", "env", "n"} and is answered with one line
//         {"n", "exit_code"}, written after the call's output (stdout and
//         stderr are pipes this process writes in blocking mode, so the
//         answer follows everything the call printed).
//     fd 4 (KILN_OUTPUT_FD): the output channel, one JSON line per output:
//         {"type": "execute_result", "data": {"text/plain": ...}} for the
//         call's value, {"exception": {...}} for what it threw (launch.js's
//         record).
//
// A call is evaluated in this process's own context in REPL mode (through
// an in-process inspector session: no port), as a browser's console
// evaluates: its declarations (var, let, const, function, class) and what it
// assigns to globalThis persist, a later call may declare a name again,
// await works at the top level, and require() resolves from /work. The
// call's value is its last expression's; a promise is awaited.
//
// Exit codes: 0; 1 for an uncaught error; process.exit(n)'s n (the
// interpreter is kept: process.exit ends the call, not the session); 130
// for an interrupt (SIGINT from the box's supervisor: a script is stopped
// where it runs, a call awaiting a promise is abandoned).

const fs = require('fs');
const net = require('net');
const util = require('util');
const vm = require('vm');
const Module = require('module');
const Inspector = require('inspector');
const { exceptionRecord, LAUNCH_ERROR } = require('./launch.js');

const WORKDIR = '/work';
const INTERRUPTED = 130;

// ExitRequest is what process.exit throws in a session: the call ends with
// its code, the interpreter stays.
class ExitRequest {
  constructor(code) {
    this.code = code;
  }
}

// callStack is an error's stack as the call's own: its code is named by
// the call's file name (the inspector names it <anonymous>), and the frames
// of this interpreter below the call are left out.
function callStack(stack, filename) {
  const lines = [];
  for (const l of stack.split('\n')) {
    if (/^\s*at (?:Session\.post|.*\(node:inspector)/.test(l)) break;
    lines.push(l.replace(/(\(|at )<anonymous>:/, `$1${filename}:`));
  }
  return lines.join('\n');
}

function serve() {
  const ctlFd = Number(process.env.KILN_SESSION_FD);
  const outFd = Number(process.env.KILN_OUTPUT_FD);
  delete process.env.KILN_SESSION_FD;
  delete process.env.KILN_OUTPUT_FD;
  const ctl = new net.Socket({ fd: ctlFd, readable: true, writable: true });
  // stdout and stderr are pipes to the relay, which node writes without
  // blocking: a write the pipe cannot take is queued and written later,
  // after the call's answer, into the next call's output. Blocking writes
  // keep every byte in its call (and a flood's pace the reader's).
  for (const s of [process.stdout, process.stderr]) {
    if (s._handle && typeof s._handle.setBlocking === 'function') s._handle.setBlocking(true);
  }
  const emit = (rec) => {
    try {
      fs.writeSync(outFd, JSON.stringify(rec) + '\n');
    } catch (e) {
      // the channel is gone: stderr still says it
    }
  };

  let current = null; // the running call: {n, interrupt()}
  process.exit = (code) => {
    throw new ExitRequest(code === undefined ? process.exitCode || 0 : Number(code) | 0);
  };
  process.on('SIGINT', () => {
    if (current) current.interrupt();
  });
  // An error thrown where no call catches it (a callback, a rejected
  // promise nobody awaits) is said on stderr, the running call's if there
  // is one; a call awaiting a promise ends with it.
  process.on('uncaughtException', (err) => {
    if (err instanceof ExitRequest) return; // process.exit in a callback: no call to end
    if (current) current.fail(err);
    else process.stderr.write('Uncaught ' + util.inspect(err) + '\n');
  });

  const globals = (n) => {
    const filename = `${WORKDIR}/<call ${n}>`;
    globalThis.require = Module.createRequire(WORKDIR + '/');
    globalThis.module = { exports: {}, filename, id: '.', path: WORKDIR, require: globalThis.require };
    globalThis.exports = globalThis.module.exports;
    globalThis.__filename = filename;
    globalThis.__dirname = WORKDIR;
    return filename;
  };

  // Calls are evaluated through an in-process inspector session in REPL
  // mode, as Chrome's console and Deno's notebooks evaluate: let and const
  // may be declared again by a later call, and top-level await keeps the
  // declarations it makes. No port is opened.
  const inspector = new Inspector.Session();
  inspector.connect();
  const post = (method, params) =>
    new Promise((resolve, reject) => inspector.post(method, params, (err, res) => (err ? reject(err) : resolve(res))));
  const HELD = Symbol.for('kiln.session.held');
  const EVALUATE = Symbol.for('kiln.session.evaluate');
  // valueOf is the value a remote object of this process stands for.
  const valueOf = async (remote) => {
    if (!remote || remote.type === 'undefined') return undefined;
    if ('value' in remote) return remote.value;
    if (remote.unserializableValue !== undefined) return vm.runInThisContext(remote.unserializableValue);
    if (!remote.objectId) return undefined;
    await post('Runtime.callFunctionOn', { objectId: remote.objectId, functionDeclaration: `function () { globalThis[Symbol.for('kiln.session.held')] = this }` });
    const v = globalThis[HELD];
    delete globalThis[HELD];
    return v;
  };

  const runCall = async (call) => {
    const filename = globals(call.n);
    process.argv = [process.argv[0], filename, ...call.args];
    Object.assign(process.env, call.env);
    let settle;
    const settled = new Promise((resolve) => {
      settle = resolve;
    });
    let evaluating = true;
    current = {
      n: call.n,
      interrupt: () => settle({ interrupted: true }),
      fail: (err) => {
        if (!evaluating) settle({ thrown: err });
        else process.stderr.write('Uncaught ' + (err instanceof Error && err.stack ? err.stack : util.inspect(err)) + '\n');
      },
    };
    const report = (err, details) => {
      if (err instanceof ExitRequest) return err.code & 0xff;
      if (err instanceof Error && typeof err.stack === 'string') {
        try {
          err.stack = callStack(err.stack, filename);
        } catch (e) {
          // a frozen error keeps its own stack
        }
      }
      process.stderr.write('Uncaught ' + (err instanceof Error && err.stack ? err.stack : util.inspect(err)) + '\n');
      const rec = exceptionRecord(err);
      if (rec.line === undefined && details && typeof details.lineNumber === 'number' && rec.type === 'SyntaxError') {
        rec.line = details.lineNumber + 1;
        rec.column = details.columnNumber + 1;
      }
      if (rec.line !== undefined && rec.source_line === undefined) {
        rec.source_line = (call.code.split('\n')[rec.line - 1] || '').trim();
      }
      emit({ exception: rec });
      return 1;
    };
    try {
      globalThis[EVALUATE] = () =>
        inspector.post('Runtime.evaluate', { expression: call.code + '\n//# sourceURL=' + filename, replMode: true, awaitPromise: true }, (err, res) =>
          settle({ err, res }),
        );
      try {
        // Its synchronous part under vm's SIGINT watch: an interrupt stops
        // a loop where it runs. What it awaits is raced with the interrupt.
        vm.runInThisContext(`globalThis[Symbol.for('kiln.session.evaluate')]()`, { breakOnSigint: true });
      } catch (err) {
        settle(err && err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED' ? { interrupted: true } : { thrown: err });
      } finally {
        delete globalThis[EVALUATE];
        evaluating = false;
      }
      const out = await settled;
      if (out.interrupted) {
        process.stderr.write('Error: Script execution interrupted.\n');
        return INTERRUPTED;
      }
      if ('thrown' in out) return report(out.thrown);
      if (out.err) {
        process.stderr.write('kiln-launcher: evaluating the call: ' + out.err.message + '\n');
        return LAUNCH_ERROR;
      }
      const { result, exceptionDetails } = out.res;
      if (exceptionDetails) return report(await valueOf(exceptionDetails.exception), exceptionDetails);
      const value = await valueOf(result);
      if (value !== undefined) emit({ type: 'execute_result', data: { 'text/plain': util.inspect(value) } });
      return 0;
    } finally {
      current = null;
    }
  };

  let buf = '';
  let queue = Promise.resolve();
  ctl.setEncoding('utf8');
  ctl.on('data', (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      const call = JSON.parse(line);
      queue = queue.then(async () => {
        let code = 1;
        try {
          code = await runCall(call);
        } catch (err) {
          process.stderr.write('kiln-launcher: the session interpreter: ' + util.inspect(err) + '\n');
        }
        await Promise.all([process.stdout, process.stderr].map((s) => (s.writableLength ? new Promise((r) => s.once('drain', r)) : null)));
        ctl.write(JSON.stringify({ n: call.n, exit_code: code }) + '\n');
      });
    }
  });
  ctl.on('end', () => process.reallyExit(0));
}

module.exports = { serve };
