// events() and artifact() against scripted local servers: the live API on this
// branch has no events or artifacts routes yet, so their client logic is
// exercised here (the live suite runs them once the API has the routes).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import http from "node:http";
import { test } from "node:test";

import { Client, IntegrityError, NotFound } from "../src/index.js";

async function serve(t, handler) {
  const seen = [];
  const srv = http.createServer((req, res) => {
    seen.push(req.headers);
    handler(seen.length, req, res);
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  t.after(() => new Promise((r) => { srv.closeAllConnections?.(); srv.close(r); }));
  return { url: `http://127.0.0.1:${srv.address().port}`, seen };
}

test("events reconnect with Last-Event-ID after a broken stream and end at the result", async (t) => {
  const s = await serve(t, (n, req, res) => {
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    if (n === 1) {
      res.write('event: status\nid: 1\ndata: {"status":"running"}\n\n');
      res.write('event: stdout\nid: 2\ndata: {"data":"first\\n"}\n\n', () => setTimeout(() => res.socket.destroy(), 50));
      return;
    }
    res.end('event: stdout\nid: 3\ndata: {"data":"second\\n"}\n\nevent: result\nid: 4\ndata: {"id":"j","status":"succeeded"}\n\n');
  });
  const c = new Client({ server: s.url, retry: { initialBackoffMs: 1, maxBackoffMs: 5 } });
  const evs = [];
  for await (const ev of c.events("j", { timeoutMs: 10_000 })) evs.push(ev);
  assert.deepEqual(evs.map((e) => [e.type, e.id]), [["status", "1"], ["stdout", "2"], ["stdout", "3"], ["result", "4"]]);
  assert.equal(s.seen.length, 2);
  assert.equal(s.seen[0]["last-event-id"], undefined);
  assert.equal(s.seen[1]["last-event-id"], "2");
  assert.equal(s.seen[1].accept, "text/event-stream");
});

test("events resume from a given id and report a missing job", async (t) => {
  const s = await serve(t, (n, req, res) => {
    if (n === 1) return res.writeHead(200, { "Content-Type": "text/event-stream" }).end("event: result\ndata: {}\n\n");
    res.writeHead(404, { "Content-Type": "application/problem+json" }).end('{"type":"urn:kiln:problem:not-found","title":"Job not found","status":404}');
  });
  const c = new Client({ server: s.url });
  for await (const ev of c.events("j", { lastEventId: "7" })) assert.equal(ev.type, "result");
  assert.equal(s.seen[0]["last-event-id"], "7");
  await assert.rejects(async () => { for await (const ev of c.events("gone")) void ev; }, NotFound);
});

test("artifact bytes are checked against the listed SHA-256 or the ETag", async (t) => {
  const body = Buffer.from("a,b\n1,2\n");
  const sum = createHash("sha256").update(body).digest("hex");
  const s = await serve(t, (n, req, res) => {
    const etag = req.url.endsWith("/bad.csv") ? `"${"0".repeat(64)}"` : `"${sum}"`;
    res.writeHead(200, { "Content-Type": "text/csv", ETag: etag }).end(body);
  });
  const c = new Client({ server: s.url });
  assert.deepEqual(Buffer.from(await c.artifact("j", "clean.csv")), body);
  assert.deepEqual(Buffer.from(await c.artifact("j", { name: "x y.csv", sha256: sum })), body);
  await assert.rejects(c.artifact("j", "bad.csv"), IntegrityError);
  await assert.rejects(c.artifact("j", { name: "clean.csv", sha256: "f".repeat(64) }), IntegrityError);
});
