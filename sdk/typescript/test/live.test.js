// The TypeScript SDK against a live Kiln: API, JetStream, worker, containerd,
// Redis. Run by internal/e2e's TestSDKs, which starts the pipeline and exports
// KILN_SERVER, KILN_API_KEY and KILN_TEST_CONTROL.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, test } from "node:test";

import {
  Client, Conflict, ConnectionFailed, IntegrityError, InvalidRequest, MethodNotAllowed, NO_RETRY, NotFound, Unauthorized,
  Unavailable, isTerminal, tools,
} from "../src/index.js";
import * as live from "./live.js";

const UNKNOWN_ID = "0190a5e4-7b1c-7d2e-8f3a-123456789abc";

describe("sessions", () => {
  test("a session keeps its state between calls", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const s = await c.session({ files: { "seed.txt": "seeded" } });
    try {
      assert.equal(s.status, "ready");
      const a = await s.run("x = 41\nopen('out.txt', 'w').write('kept')\nprint(open('seed.txt').read())");
      assert.deepEqual([a.status, a.stdout, a.seq, a.incarnation, a.state_restored], ["succeeded", "seeded\n", 1, 1, true]);
      const b = await s.run("print(x + 1)");
      assert.deepEqual([b.stdout, b.seq], ["42\n", 2]);
      assert.equal(new TextDecoder().decode(await s.readFile("out.txt")), "kept");
      assert.equal((await c.getSession(s.id)).id, s.id);
    } finally {
      await s.close();
    }
    assert.equal(s.status, "ended");
    await assert.rejects(s.run("print(x)"), (e) => e.status === 410);
  });
});

describe("listing, metadata, replay, audit", () => {
  test("a session's env reaches its calls under their own", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const s = await c.session({ env: { GREETING: "session", LEVEL: "session" } });
    try {
      const r = await s.run("import os\nprint(os.environ['GREETING'], os.environ['LEVEL'])", { env: { LEVEL: "call" } });
      assert.equal(r.stdout, "session call\n");
    } finally {
      await s.close();
    }
  });

  test("jobs listed by tag and status, a page at a time; a replay and its audit record; sessions by tag", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const tag = live.unique().replace(/[^0-9a-f]/g, "").slice(-12);
    const failed = await c.run(live.unique() + "import sys; sys.exit(3)", { metadata: { suite: tag }, cache: false, timeoutMs: 60_000 });
    assert.deepEqual([failed.status, failed.metadata], ["failed", { suite: tag }]);
    const ok = await c.run(live.unique() + "print(1)", { metadata: { suite: tag }, cache: false, timeoutMs: 60_000 });
    const page = await c.listJobs({ tags: { suite: tag }, limit: 1 });
    assert.deepEqual(page.jobs.map((j) => j.id), [ok.id]);
    const rest = await c.listJobs({ tags: { suite: tag }, cursor: page.next_cursor });
    assert.deepEqual([rest.jobs.map((j) => j.id), rest.jobs[0].exit_code], [[failed.id], 3]);
    assert.deepEqual((await c.listJobs({ status: "failed", tags: { suite: tag } })).jobs.map((j) => j.id), [failed.id]);
    const all = [];
    for await (const j of c.iterJobs({ tags: { suite: tag }, limit: 1 })) all.push(j.id);
    assert.deepEqual(all, [ok.id, failed.id]);
    const again = await c.replay(ok.id);
    assert.equal(again.accepted, true);
    const done = await c.wait(again.id, { timeoutMs: 60_000 });
    assert.deepEqual([done.replay_of, done.stdout], [ok.id, "1\n"]);
    const kinds = new Set((await c.audit({ kind: "replay" })).map((r) => r.kind));
    assert.deepEqual([...kinds], ["replay"]);
    const s = await c.session({ metadata: { suite: tag } });
    try {
      assert.deepEqual((await c.sessions({ tags: { suite: tag } })).map((x) => x.id), [s.id]);
      assert.deepEqual(s.metadata, { suite: tag });
      assert.deepEqual(await c.sessions({ tags: { suite: tag + "-other" } }), []);
    } finally {
      await s.close();
    }
  });
});

describe("jobs", () => {
  test("run, submit, wait, get", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const r = await c.run(live.unique() + "import sys\nprint(6*7)\nsys.stdin.read()", { stdin: "x", timeoutMs: 60_000 });
    assert.deepEqual([r.status, r.exit_code, r.stdout], ["succeeded", 0, "42\n"]);
    assert.ok(isTerminal(r));
    assert.match(r.image.digest, /^sha256:/);
    const again = await c.submit(live.unique() + "print(1)");
    assert.deepEqual([again.accepted, again.status], [true, "queued"]);
    assert.equal((await c.wait(again.id, { timeoutMs: 60_000 })).stdout, "1\n");
    assert.equal((await c.get(again.id)).status, "succeeded");
  });

  test("files and failure categories", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const r = await c.run(live.unique() + "print(open('in.bin','rb').read().hex(), open('t.txt').read())", {
      files: { "in.bin": new Uint8Array([0, 255]), "t.txt": "hi" }, timeoutMs: 60_000,
    });
    assert.equal(r.stdout, "00ff hi\n");
    const bad = await c.run(live.unique() + "print(", { timeoutMs: 60_000 });
    assert.deepEqual([bad.status, bad.error.category, bad.error.retryable], ["failed", "syntax_error", false]);
    const slow = await c.run(live.unique() + "import time\ntime.sleep(10)", { limits: { timeout_ms: 1000 }, timeoutMs: 60_000 });
    assert.deepEqual([slow.status, slow.error.category], ["timed_out", "timeout"]);
  });

  test("idempotent submit", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const code = live.unique() + "print('idem')";
    const key = "ts-idem-" + code.slice(6, 30);
    const a = await c.submit(code, { idempotencyKey: key });
    const b = await c.submit(code, { idempotencyKey: key });
    assert.equal(a.id, b.id);
    await assert.rejects(c.submit(code + "#other", { idempotencyKey: key }), (e) => e instanceof Conflict && e.field === "Idempotency-Key");
    await c.wait(a.id, { timeoutMs: 60_000 });
  });

  test("batch, jobs and waitAll", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const items = await c.batch([live.unique() + "print('a')", { code: live.unique() + "print('b')" }, { code: "" }]);
    assert.deepEqual(items.map((i) => i.index), [0, 1, 2]);
    assert.ok(items[0].job && items[1].job);
    assert.ok(items[2].error instanceof InvalidRequest);
    assert.equal(items[2].error.field, "jobs[2].code");
    const ids = [items[0].job.id, items[1].job.id];
    const results = await c.waitAll(ids, { timeoutMs: 120_000 });
    assert.deepEqual(results.map((r) => r.stdout), ["a\n", "b\n"]);
    const listed = await c.jobs([...ids, UNKNOWN_ID]);
    assert.deepEqual(listed.map((j) => j?.id ?? null), [...ids, null]);
  });

  test("cancel", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const running = await c.submit(live.unique() + "import time\nprint('started', flush=True)\ntime.sleep(30)", { cache: false });
    const until = Date.now() + 60_000;
    while ((await c.get(running.id)).status === "queued" && Date.now() < until) await live.sleep(100);
    await c.cancel(running.id);
    const r = await c.wait(running.id, { timeoutMs: 60_000 });
    assert.deepEqual([r.status, r.error.category], ["canceled", "canceled"]);
  });

  test("every error class", async (t) => {
    const c = live.client(t);
    if (!c) return;
    await assert.rejects(c.submit("print(1)", { limits: { memory_mb: 1 << 20 } }),
      (e) => e instanceof InvalidRequest && e.status === 422 && e.field === "limits.memory_mb");
    await assert.rejects(c.get("../etc/passwd"), (e) => e instanceof InvalidRequest && e.status === 400);
    await assert.rejects(c.get(UNKNOWN_ID), NotFound);
    await assert.rejects(new Client({ apiKey: "wrong" }).runtimes(), Unauthorized);
    await assert.rejects(c._call("PUT", "/v1/jobs"), MethodNotAllowed);
    await assert.rejects(c.batch(Array(101).fill({ code: "print(1)" })), InvalidRequest);
    assert.deepEqual((await c.runtimes()).map((r) => r.name).sort(), ["node", "python"]);
  });
});

describe("outages", () => {
  test("submit retries through a queue outage under one idempotency key", async (t) => {
    const c = live.client(t);
    if (!c || !live.require(t, "KILN_TEST_CONTROL")) return;
    await live.control("POST", "/nats/stop");
    let r;
    const key = "ts-outage-" + live.unique().slice(6, 30);
    const code = live.unique() + "print('after outage')";
    try {
      await assert.rejects(new Client({ retry: NO_RETRY }).submit(live.unique() + "print(1)"), (e) => e instanceof Unavailable && e.retryAfter > 0);
      const restart = live.sleep(2000).then(() => live.control("POST", "/nats/start"));
      r = await c.submit(code, { idempotencyKey: key }); // 503s until NATS is back, then accepted
      await restart;
    } finally {
      await live.control("POST", "/nats/start");
    }
    assert.equal((await c.submit(code, { idempotencyKey: key })).id, r.id, "a retry created a second job");
    assert.equal((await c.wait(r.id, { timeoutMs: 90_000 })).stdout, "after outage\n");
  });

  test("wait survives an API restart", async (t) => {
    const c = live.client(t);
    if (!c || !live.require(t, "KILN_TEST_CONTROL")) return;
    const before = Number(await live.control("GET", "/api/restarts"));
    const job = await c.submit(live.unique() + "import time\ntime.sleep(4)\nprint('survived')", { cache: false });
    const waiting = c.wait(job.id, { timeoutMs: 90_000 });
    await live.sleep(1000); // the wait is now a long-poll on the API
    await live.control("POST", "/api/restart?down=2s");
    await assert.rejects(new Client({ retry: NO_RETRY }).get(job.id), ConnectionFailed);
    const r = await waiting;
    assert.deepEqual([r.status, r.stdout], ["succeeded", "survived\n"]);
    assert.ok(Number(await live.control("GET", "/api/restarts")) > before);
  });
});

describe("tool calls", () => {
  test("Anthropic round trip: success and a fixable SyntaxError", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const block = { type: "tool_use", id: "toolu_01", name: "run_python", input: { code: live.unique() + "print(sum(range(10)))" } };
    const out = await c.runToolCall(block, { timeoutMs: 60_000 });
    assert.deepEqual([out.type, out.tool_use_id, out.is_error], ["tool_result", "toolu_01", false]);
    assert.ok(out.content[0].text.includes("stdout:\n45\n"), out.content[0].text);
    const bad = await c.runToolCall({ ...block, input: { code: live.unique() + "def f(:\n" } }, { timeoutMs: 60_000 });
    assert.equal(bad.is_error, true);
    for (const want of ["error_category: syntax_error", "retry_with_changed_code_can_help: yes", "retry_same_call_can_help: false", "exception_type: SyntaxError"]) {
      assert.ok(bad.content[0].text.includes(want), want);
    }
  });

  test("a chart comes back as the server's image block", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const code = live.unique() + "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()\n";
    const out = await c.runToolCall({ type: "tool_use", id: "toolu_c", name: "run_python", input: { code } }, { timeoutMs: 60_000 });
    assert.deepEqual(out.content.map((b) => b.type), ["text", "image"]);
    assert.equal(out.content[1].source.media_type, "image/png");
    assert.ok(out.content[0].text.includes("(image output-1, image/png)"));
    assert.equal(Buffer.from(out.content[1].source.data, "base64").subarray(0, 8).toString("latin1"), "\x89PNG\r\n\x1a\n");
    // The Responses API's function_call: the server's function_call_output,
    // the chart as an input_image.
    const call = { type: "function_call", id: "fc_1", call_id: "call_1", name: "run_python", arguments: JSON.stringify({ code }) };
    const resp = await c.runToolCall(call, { timeoutMs: 60_000 });
    assert.deepEqual([resp.type, resp.call_id], ["function_call_output", "call_1"]);
    assert.deepEqual(resp.output.map((p) => p.type), ["input_text", "input_image"]);
    assert.ok(resp.output[0].text.includes("(image output-1, image/png)"));
    const prefix = "data:image/png;base64,";
    assert.ok(resp.output[1].image_url.startsWith(prefix));
    assert.equal(Buffer.from(resp.output[1].image_url.slice(prefix.length), "base64").subarray(0, 8).toString("latin1"), "\x89PNG\r\n\x1a\n");
    // Exactly what the server answers the same call (job ids aside: a cache
    // hit has an id of its own).
    for (const each of [call, { type: "tool_use", id: "toolu_c", name: "run_python", input: { code } },
      { id: "call_2", type: "function", function: { name: "run_python", arguments: JSON.stringify({ code }) } }]) {
      assert.deepEqual(live.withoutJobIds(await c.runToolCall(each, { timeoutMs: 60_000 })), live.withoutJobIds(await live.postToolCall(each)));
    }
  });

  test("OpenAI round trip: a timeout and unparsable arguments", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const call = { id: "call_9", type: "function", function: { name: "run_python",
      arguments: JSON.stringify({ code: live.unique() + "import time\ntime.sleep(5)", timeout_s: 1 }) } };
    const out = await c.runToolCall(call, { timeoutMs: 60_000 });
    assert.deepEqual([out.role, out.tool_call_id], ["tool", "call_9"]);
    assert.ok(out.content.includes("status: timed_out") && out.content.includes("error_category: timeout"), out.content);
    const broken = await c.runToolCall({ id: "call_10", type: "function", function: { name: "run_python", arguments: "{not json" } });
    assert.ok(broken.content.includes("error_category: invalid_request"), broken.content);
  });
});

const OUTPUT_DIR_CODE = "import os\nout = os.environ.get('KILN_OUTPUT_DIR') or '/work/out'\nos.makedirs(out, exist_ok=True)\n";

// Artifacts and the event stream.
describe("artifacts and events", () => {
  test("artifacts download with their SHA-256 checked", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const png = Buffer.concat([Buffer.from("\x89PNG\r\n\x1a\n", "latin1"), Buffer.from(Array.from({ length: 1024 }, (_, i) => i % 256))]);
    const r = await c.run(live.unique() + OUTPUT_DIR_CODE +
      `open(os.path.join(out, 'chart.png'), 'wb').write(bytes.fromhex('${png.toString("hex")}'))\n` +
      "open(os.path.join(out, 'clean.csv'), 'w').write('a,b\\n1,2\\n')\n", { timeoutMs: 60_000 });
    assert.equal(r.status, "succeeded", r.stderr);
    const byName = Object.fromEntries(r.artifacts.map((a) => [a.name, a]));
    assert.deepEqual(Object.keys(byName).sort(), ["chart.png", "clean.csv"]);
    const chart = byName["chart.png"];
    assert.deepEqual([chart.size ?? chart.bytes, chart.sha256, chart.content_type],
      [png.length, createHash("sha256").update(png).digest("hex"), "image/png"]);
    assert.deepEqual(Buffer.from(await c.artifact(r.id, chart)), png);
    assert.equal(new TextDecoder().decode(await c.artifact(r.id, "clean.csv")), "a,b\n1,2\n"); // checked against the ETag
    await assert.rejects(c.artifact(r.id, { ...chart, sha256: "0".repeat(64) }), IntegrityError);
    await assert.rejects(c.artifact(r.id, "missing.txt"), NotFound);
    const tr = tools.toolResult(r, "toolu_a", "anthropic", { baseUrl: c.server });
    assert.ok(JSON.parse(tr.content[0].text).artifacts.some((a) => a.url.endsWith(`/v1/jobs/${r.id}/artifacts/chart.png`)));
  });

  test("event stream, live and resumed across an API restart", async (t) => {
    const c = live.client(t);
    if (!c) return;
    const job = await c.submit(live.unique() + "import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')", { cache: false });
    const text = (ev) => ev.data?.data ?? (ev.data?.data_base64 ? Buffer.from(ev.data.data_base64, "base64").toString() : "");
    const seen = [];
    const texts = [];
    let restarted = false;
    let firstAt;
    let endAt;
    for await (const ev of c.events(job.id, { timeoutMs: 90_000 })) {
      seen.push(ev);
      if (ev.type === "stdout") {
        texts.push(text(ev));
        if (text(ev).includes("first") && firstAt === undefined) {
          firstAt = Date.now();
          if (process.env.KILN_TEST_CONTROL && ev.id !== undefined) {
            await live.control("POST", "/api/restart?down=1s");
            restarted = true;
          }
        }
      }
      if (ev.type === "result") endAt = Date.now();
    }
    assert.equal(seen.at(-1).type, "result");
    assert.equal(seen.at(-1).data.status, "succeeded");
    assert.equal(texts.join(""), "first\nsecond\n", restarted ? "output lost or repeated across the reconnect" : "");
    assert.ok(seen.some((e) => e.type === "status"));
    assert.ok(endAt - firstAt > 1500, "the first line was not streamed live");
    const late = [];
    for await (const ev of c.events(job.id, { timeoutMs: 30_000 })) late.push(ev);
    assert.equal(late.at(-1).type, "result");
    const first = seen.find((e) => e.type === "stdout" && e.id !== undefined);
    assert.ok(first, "stdout events carry no id: Last-Event-ID cannot resume");
    const resumed = [];
    for await (const ev of c.events(job.id, { lastEventId: first.id, timeoutMs: 30_000 })) resumed.push(ev);
    assert.ok(!resumed.some((e) => e.type === "stdout" && text(e) === "first\n"));
    assert.equal(resumed.at(-1).type, "result");
  });
});
