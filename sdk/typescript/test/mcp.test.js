// The official MCP TypeScript SDK's client against `kiln mcp` (stdio, and
// streamable HTTP with --http), on a live API: a chart comes back as text and
// an image block, state persists between tool calls with `kiln mcp
// --sessions`, a job longer than the SDK's 60 s default request timeout
// succeeds because the server sends notifications/progress and the client
// resets its timeout on them, and a call the client gives up over streamable
// HTTP (aborted, the session closed at once) has its job canceled.
// Needs $KILN_SERVER and $KILN_BIN (the kiln binary); run by internal/e2e
// (TestMCPTypeScriptClient) after `npm ci` here.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Client as Kiln } from "../src/index.js";
import * as live from "./live.js";

async function connect(t, ...flags) {
  if (!live.require(t, "KILN_SERVER", "KILN_BIN")) return undefined;
  const transport = new StdioClientTransport({
    command: process.env.KILN_BIN, args: ["mcp", ...flags], stderr: "inherit",
    env: { KILN_SERVER: process.env.KILN_SERVER, KILN_API_KEY: process.env.KILN_API_KEY ?? "", PATH: process.env.PATH },
  });
  const client = new Client({ name: "kiln-mcp-test", version: "1" });
  await client.connect(transport);
  t.after(() => client.close());
  return client;
}

test("a chart comes back as text and an image block", async (t) => {
  const client = await connect(t);
  if (!client) return;
  const code = live.unique() + "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()\n";
  const res = await client.callTool({ name: "run_python", arguments: { code } });
  assert.notEqual(res.isError, true, res.content[0].text);
  assert.equal(res.content[0].type, "text");
  assert.ok(res.content[0].text.includes("(image output-1, image/png)"), res.content[0].text);
  const img = res.content.find((c) => c.type === "image");
  assert.ok(img && img.mimeType === "image/png" && Buffer.from(img.data, "base64").subarray(1, 4).toString() === "PNG");
});

test("a 90 s job outlasts the 60 s request timeout on progress", { timeout: 200_000 }, async (t) => {
  const client = await connect(t);
  if (!client) return;
  const progress = [];
  const code = live.unique() + "import time\ntime.sleep(90)\nprint('slept')\n";
  const res = await client.callTool({ name: "run_python", arguments: { code, timeout_s: 120 } }, undefined, {
    resetTimeoutOnProgress: true, onprogress: (p) => progress.push(p.progress), maxTotalTimeout: 180_000,
  });
  assert.notEqual(res.isError, true, res.content[0].text);
  assert.ok(res.content[0].text.includes("stdout:\nslept\n"), res.content[0].text);
  assert.ok(progress.length >= 10, `progress notifications: ${progress.length}`);
});

test("with --sessions, variables persist from one tool call to the next", async (t) => {
  const client = await connect(t, "--sessions", "on");
  if (!client) return;
  const first = await client.callTool({ name: "run_python", arguments: { code: live.unique() + "x = 41\nimport pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})\n" } });
  assert.notEqual(first.isError, true, first.content[0].text);
  const second = await client.callTool({ name: "run_python", arguments: { code: "print(x + 1, int(df['a'].sum()))" } });
  assert.notEqual(second.isError, true, second.content[0].text);
  assert.ok(second.content[0].text.includes("stdout:\n42 6\n"), second.content[0].text);
  // A new MCP session is a new Kiln session: nothing of the first.
  const other = await connect(t, "--sessions", "on");
  const fresh = await other.callTool({ name: "run_python", arguments: { code: "print(x)" } });
  assert.ok(fresh.content[0].text.includes("NameError"), fresh.content[0].text);
});

test("with --sessions, run_node keeps globalThis, a module and a file from one tool call to the next", async (t) => {
  // Issue 36, acceptance 4: node has sessions, so run_node is stateful.
  const client = await connect(t, "--sessions", "on");
  if (!client) return;
  const first = await client.callTool({ name: "run_node", arguments: { code: "globalThis.n = 41\nconst fs = require('fs')\nfs.writeFileSync('n.txt', 'kept')" } });
  assert.notEqual(first.isError, true, first.content[0].text);
  const second = await client.callTool({ name: "run_node", arguments: { code: "console.log(n + 1, fs.readFileSync('n.txt', 'utf8'))" } });
  assert.notEqual(second.isError, true, second.content[0].text);
  assert.ok(second.content[0].text.includes("stdout:\n42 kept\n"), second.content[0].text);
});

// Starts `kiln mcp --http` on a free loopback port; resolves to its URL,
// which it prints on stderr once it listens.
function serveHTTP(t) {
  const child = spawn(process.env.KILN_BIN, ["mcp", "--http", "127.0.0.1:0"], {
    env: { KILN_SERVER: process.env.KILN_SERVER, KILN_API_KEY: process.env.KILN_API_KEY ?? "", PATH: process.env.PATH },
    stdio: ["ignore", "inherit", "pipe"],
  });
  t.after(() => child.kill());
  return new Promise((resolve, reject) => {
    let seen = "";
    child.stderr.on("data", (d) => {
      process.stderr.write(d);
      seen += d;
      const m = /streamable HTTP at (http:\/\/\S+)/.exec(seen);
      if (m) resolve(m[1]);
    });
    child.on("exit", (code) => reject(new Error(`kiln mcp --http exited (${code}) before listening: ${seen}`)));
  });
}

test("a call given up over streamable HTTP cancels its job", { timeout: 150_000 }, async (t) => {
  if (!live.require(t, "KILN_SERVER", "KILN_BIN")) return;
  const client = new Client({ name: "kiln-mcp-test", version: "1" });
  await client.connect(new StreamableHTTPClientTransport(new URL(await serveHTTP(t))));
  const abort = new AbortController();
  let started;
  const jobId = new Promise((resolve) => { started = resolve; });
  const code = live.unique() + "import time\ntime.sleep(100)\nprint('not canceled')\n";
  const call = client.callTool({ name: "run_python", arguments: { code, timeout_s: 120 } }, undefined, {
    signal: abort.signal, timeout: 140_000,
    onprogress: (p) => { const m = /^job (\S+):/.exec(p.message ?? ""); if (m) started(m[1]); }, // the job's id, once it is queued
  });
  const id = await jobId;
  // The client gives up: the call aborted and the session closed at once
  // (its HTTP requests aborted, no DELETE of the session).
  abort.abort();
  await client.close();
  await assert.rejects(call);
  const job = await new Kiln().wait(id, { timeoutMs: 60_000 }); // well before the job's 100 s
  assert.equal(job.status, "canceled", JSON.stringify(job));
});
