// Helpers for the suite that runs against a live Kiln API. The API is given by
// $KILN_SERVER / $KILN_API_KEY; $KILN_TEST_CONTROL is the harness's control
// endpoint (internal/e2e/sdk_test.go) that restarts the API or stops NATS.
// Without them a live test is skipped, or fails when KILN_INTEGRATION=require.
import { Client, NotFound } from "../src/index.js";

/** Skips t (or fails it under KILN_INTEGRATION=require) unless the variables are set; true when they are. */
export function require(t, ...names) {
  const missing = names.filter((n) => !process.env[n]);
  if (!missing.length) return true;
  const msg = "live API tests need " + missing.join(", ");
  if (process.env.KILN_INTEGRATION === "require") throw new Error(msg + " (KILN_INTEGRATION=require)");
  t.skip(msg);
  return false;
}

export function client(t, opts = {}) {
  return require(t, "KILN_SERVER") ? new Client(opts) : undefined;
}

export async function control(method, path) {
  const r = await fetch(process.env.KILN_TEST_CONTROL + path, { method });
  if (!r.ok) throw new Error(`control ${method} ${path}: ${r.status}`);
  return (await r.text()).trim();
}

/** A comment that makes code unique, so the result cache does not answer it. */
export function unique() {
  return `# run ${globalThis.crypto?.randomUUID?.() ?? Math.random().toString(36).slice(2) + Date.now()}\n`;
}


export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** POST /v1/tool-calls with the call as it is, without the SDK: what the server returns. */
export async function postToolCall(call) {
  const headers = { "Content-Type": "application/json" };
  if (process.env.KILN_API_KEY) headers.Authorization = "Bearer " + process.env.KILN_API_KEY;
  const r = await fetch(process.env.KILN_SERVER.replace(/\/+$/, "") + "/v1/tool-calls", { method: "POST", headers, body: JSON.stringify(call) });
  if (!r.ok) throw new Error(`POST /v1/tool-calls: ${r.status} ${await r.text()}`);
  return r.json();
}

/** v with every job id replaced: a result-cache hit answers under an id of its own. */
export function withoutJobIds(v) {
  return JSON.parse(JSON.stringify(v).replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, "<id>"));
}
