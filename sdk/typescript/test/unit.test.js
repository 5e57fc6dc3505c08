// Client logic against scripted local HTTP servers (no Kiln needed).
import assert from "node:assert/strict";
import http from "node:http";
import { describe, test } from "node:test";

import {
  BudgetExhausted, Client, Conflict, ConnectionFailed, DecodeError, EgressNotAllowed, KilnError, InvalidRequest, NotFound, QueueFull, ServerError, Unavailable, errorClass, parseSSE, tools,
} from "../src/index.js";

const fast = { initialBackoffMs: 1, maxBackoffMs: 5 };

/** A server answering the n-th request with steps[n] (the last repeats). */
async function scripted(t, ...steps) {
  const seen = [];
  const srv = http.createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      seen.push({ at: Date.now(), method: req.method, url: req.url, headers: req.headers, body });
      steps[Math.min(seen.length - 1, steps.length - 1)](req, res);
    });
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  t.after(() => new Promise((r) => { srv.closeAllConnections?.(); srv.close(r); }));
  return { url: `http://127.0.0.1:${srv.address().port}`, seen };
}

const problem = (status, type, retryAfter) => (req, res) => {
  const h = { "Content-Type": "application/problem+json" };
  if (retryAfter) h["Retry-After"] = retryAfter;
  res.writeHead(status, h).end(JSON.stringify({ type: `urn:kiln:problem:${type}`, title: "t", status, detail: "d", field: "f" }));
};
const json = (status, body) => (req, res) => res.writeHead(status, { "Content-Type": "application/json" }).end(JSON.stringify(body));
const hangUp = (req, res) => res.socket.destroy();

test("submit honours Retry-After and reuses one Idempotency-Key", async (t) => {
  const s = await scripted(t, problem(429, "queue-full", "1"), json(202, { id: "j1", status: "queued" }));
  const c = new Client({ server: s.url, apiKey: "k", retry: fast });
  const job = await c.submit("print(1)", { cache: false });
  assert.equal(job.accepted, true);
  assert.equal(s.seen.length, 2);
  assert.ok(s.seen[1].at - s.seen[0].at >= 1000, "retried before the server's Retry-After");
  const keys = s.seen.map((r) => r.headers["idempotency-key"]);
  assert.ok(keys[0] && keys[0] === keys[1], `keys ${keys}`);
  assert.equal(s.seen[0].headers.authorization, "Bearer k");
  assert.deepEqual(JSON.parse(s.seen[0].body), { code: "print(1)", cache: false });
});

test("permanent errors are not retried and map to their class", async (t) => {
  const s = await scripted(t, problem(422, "invalid-field"));
  const c = new Client({ server: s.url, retry: fast });
  await assert.rejects(c.submit("x"), (e) => e instanceof InvalidRequest && e.status === 422 && e.field === "f");
  assert.equal(s.seen.length, 1);
});

test("an answer that does not decode is a DecodeError, not retried", async (t) => {
  const deep = "[".repeat(1_000_000) + "]".repeat(1_000_000);
  const body = `{"id":"j","status":"succeeded","outputs":[{"type":"execute_result","data":{"text/plain":"x","application/json":${deep}}}]}`;
  const s = await scripted(t, (req, res) => res.writeHead(200, { "Content-Type": "application/json" }).end(body));
  const c = new Client({ server: s.url, retry: fast });
  // V8 parses deep nesting without recursing: the job decodes.
  const job = await c.get("j");
  assert.equal(job.outputs.length, 1);
  const bad = await scripted(t, (req, res) => res.writeHead(200, { "Content-Type": "application/json" }).end("{not json"));
  const c2 = new Client({ server: bad.url, retry: fast });
  await assert.rejects(c2.get("j"), (e) => e instanceof DecodeError && e instanceof KilnError && e.status === 200);
  assert.equal(bad.seen.length, 1);
});

test("retries end after maxAttempts with the last error", async (t) => {
  const s = await scripted(t, problem(503, "unavailable"));
  const c = new Client({ server: s.url, retry: { ...fast, maxAttempts: 3 } });
  await assert.rejects(c.submit("x"), Unavailable);
  assert.equal(s.seen.length, 3);
});

test("a batch is not retried when the request may have arrived; a submit is", async (t) => {
  const s = await scripted(t, hangUp, hangUp, json(202, { id: "j1", status: "queued" }));
  const c = new Client({ server: s.url, retry: fast });
  await assert.rejects(c.batch([{ code: "x" }]), (e) => e instanceof ConnectionFailed && e.sent);
  assert.equal(s.seen.length, 1);
  assert.equal((await c.submit("x")).id, "j1");
  assert.equal(s.seen.length, 3);
});

test("a refused connection is retried, also for a batch", async (t) => {
  const probe = http.createServer();
  await new Promise((r) => probe.listen(0, "127.0.0.1", r));
  const port = probe.address().port;
  await new Promise((r) => probe.close(r));
  const c = new Client({ server: `http://127.0.0.1:${port}`, retry: { initialBackoffMs: 50, maxBackoffMs: 100 } });
  const pending = c.batch([{ code: "x" }]);
  await new Promise((r) => setTimeout(r, 300));
  const srv = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => json(200, { jobs: [{ index: 0, status: 202, job: { id: "j1", status: "queued" } }] })(req, res));
  });
  await new Promise((r) => srv.listen(port, "127.0.0.1", r));
  t.after(() => new Promise((r) => srv.close(r)));
  const items = await pending;
  assert.deepEqual(items.map((i) => [i.index, i.job.id, i.job.accepted]), [[0, "j1", true]]);
});

test("wait keeps polling through outages until the job is terminal", async (t) => {
  const s = await scripted(t, json(200, { id: "j", status: "running" }), hangUp, problem(503, "unavailable", "0"),
    json(200, { id: "j", status: "succeeded", stdout: "ok\n" }));
  const c = new Client({ server: s.url, retry: fast, longPollMs: 50 });
  const job = await c.wait("j");
  assert.equal(job.stdout, "ok\n");
  assert.equal(s.seen.length, 4);
  assert.match(s.seen[0].url, /^\/v1\/jobs\/j\?wait=50ms$/);
});

test("wait gives up with a non-temporary error at once", async (t) => {
  const s = await scripted(t, problem(404, "not-found"));
  const c = new Client({ server: s.url, retry: fast });
  await assert.rejects(c.wait("nope"), NotFound);
});

test("problem types map to error classes", () => {
  assert.equal(errorClass(429, "urn:kiln:problem:queue-full"), QueueFull);
  assert.equal(errorClass(422, "urn:kiln:problem:idempotency-key-reused"), Conflict);
  assert.equal(errorClass(500, "urn:kiln:problem:internal"), ServerError);
  assert.equal(errorClass(418, ""), InvalidRequest);
  assert.equal(new QueueFull("x").temporary, true);
  assert.equal(new ServerError("x", { status: 500 }).temporary, false);
});

test("budgets: create, read, and a job refused by its budget is not retried", async (t) => {
  const bud = { id: "bud_" + "0".repeat(32), max_runs: 1, used: { runs: 0, cpu_ms: 0, wall_ms: 0, artifact_bytes: 0 } };
  const s = await scripted(t, json(201, bud), json(200, bud), problem(409, "budget-exhausted"));
  const c = new Client({ server: s.url, retry: fast });
  assert.equal((await c.createBudget({ max_runs: 1 })).id, bud.id);
  assert.equal((await c.getBudget(bud.id)).max_runs, 1);
  await assert.rejects(c.submit("print(1)", { budget: bud.id }), BudgetExhausted);
  assert.deepEqual(s.seen.map((r) => `${r.method} ${r.url}`), ["POST /v1/budgets", `GET /v1/budgets/${bud.id}`, "POST /v1/jobs"]);
  assert.deepEqual(JSON.parse(s.seen[0].body), { max_runs: 1 });
  assert.equal(JSON.parse(s.seen[2].body).budget, bud.id);
});

test("network: the allowlist goes as sent, and a host the key does not allow is not retried", async (t) => {
  const s = await scripted(t, problem(422, "egress-not-allowed"));
  const c = new Client({ server: s.url, retry: fast });
  await assert.rejects(c.submit("print(1)", { network: { allow: ["api.example.org"] }, cache: true }),
    (e) => e instanceof EgressNotAllowed && e instanceof InvalidRequest && e.status === 422 && !e.temporary);
  assert.equal(s.seen.length, 1);
  assert.deepEqual(JSON.parse(s.seen[0].body), { code: "print(1)", network: { allow: ["api.example.org"] }, cache: true });
});

test("SSE parser: ids, multi-line data, comments, CRLF split across chunks", async () => {
  const enc = new TextEncoder();
  async function* chunks() {
    for (const c of [": hi\r", "\nevent: stdout\nid: 1\ndata: {\"data\":", "\"a\\n\"}\r", "\n\r\n", "data: x\ndata: y\n\n", "event: result\ndata: {}\n\n"]) {
      yield enc.encode(c);
    }
  }
  const evs = [];
  for await (const ev of parseSSE(chunks())) evs.push(ev);
  assert.deepEqual(evs, [
    { type: "stdout", data: { data: "a\n" }, id: "1" },
    { type: "message", data: "x\ny", id: "1" },
    { type: "result", data: {}, id: "1" },
  ]);
});

test("tool helpers: definitions, parsing both vendors' calls, results", () => {
  assert.equal(tools.toolDefinition("anthropic").name, "run_python");
  assert.equal(tools.toolDefinition("openai").function.parameters.required[0], "code");
  const rd = tools.toolDefinition("openai-responses");
  assert.deepEqual([rd.type, rd.name, rd.strict], ["function", "run_python", false]);
  // Every format goes to POST /v1/tool-calls as it is (runtime may rename the
  // tool), so the server's answer is the block runToolCall returns.
  const fc = { type: "function_call", id: "fc_1", call_id: "call_1", name: "run_python", arguments: '{"code":"1"}' };
  assert.deepEqual(tools.serverCall(fc), { format: "openai-responses", callId: "call_1", body: fc });
  assert.deepEqual(tools.serverCall(fc, { runtime: "python-slim" }).body, { ...fc, name: "run_python_slim" });
  assert.throws(() => tools.toolDefinition("other"), RangeError);
  const a = tools.parseToolCall({ type: "tool_use", id: "t1", name: "run_python", input: { code: "print(1)", timeout_s: 999 } });
  assert.deepEqual([a.format, a.callId, a.spec], ["anthropic", "t1", { code: "print(1)", runtime: "python", limits: { timeout_ms: 300000 } }]);
  const o = tools.parseToolCall({ id: "c1", type: "function", function: { name: "run_python", arguments: '{"code":"x","stdin":"in"}' } });
  assert.deepEqual([o.format, o.spec.stdin], ["openai", "in"]);
  assert.throws(() => tools.parseToolCall({ id: "c2", type: "function", function: { name: "run_python", arguments: "{bad" } }),
    (e) => e instanceof tools.ToolCallError && e.callId === "c2" && e.format === "openai");
  const failed = { id: "j", status: "failed", exit_code: 1, stdout: "", stderr: "SyntaxError", wall_ms: 5,
    error: { category: "syntax_error", message: "m", retryable: false }, artifacts: [{ name: "a b.png", size: 3, sha256: "h", content_type: "image/png" }] };
  const ar = tools.toolResult(failed, "t1", "anthropic", { baseUrl: "http://k/" });
  assert.equal(ar.is_error, true);
  const body = JSON.parse(ar.content[0].text);
  assert.deepEqual(body.error, { category: "syntax_error", message: "m", retryable: false, fix_code_and_retry: true });
  assert.equal(body.artifacts[0].url, "http://k/v1/jobs/j/artifacts/a%20b.png");
  const orr = tools.toolResult({ ...failed, status: "succeeded", error: undefined }, "c1", "openai");
  assert.deepEqual([orr.role, orr.tool_call_id, JSON.parse(orr.content).is_error], ["tool", "c1", false]);
  const er = tools.errorResult("bad", "r1", "openai-responses");
  assert.deepEqual([er.type, er.call_id, JSON.parse(er.output).is_error], ["function_call_output", "r1", true]);
});

test("the server URL is checked", () => {
  assert.throws(() => new Client({ server: "ftp://x" }), TypeError);
  assert.throws(() => new Client({ server: "nonsense" }), TypeError);
});

describe("generated from the OpenAPI document", () => {
  test("every problem type has its error class", async () => {
    const schema = await import("../src/schema.js");
    const errors = await import("../src/index.js");
    for (const t of schema.PROBLEM_TYPES) {
      const cls = errors.errorClass(400, t);
      assert.equal(cls.name, schema.ERROR_CLASS_BY_TYPE[t.slice(schema.PROBLEM_PREFIX.length)], t);
      assert.ok(cls.prototype instanceof errors.KilnError, t);
    }
    assert.equal(errors.errorClass(429, "urn:kiln:problem:quota-exceeded:sessions"), errors.QuotaExceeded);
    assert.equal(errors.errorClass(410), errors.SessionEnded);
    assert.deepEqual(new Set(schema.STATUSES), new Set([...schema.PENDING_STATUSES, ...schema.TERMINAL_STATUSES]));
    for (const st of schema.TERMINAL_STATUSES) assert.ok(errors.isTerminal({ status: st }), st);
  });
});
