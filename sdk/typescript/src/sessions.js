// Sessions: a sandbox whose interpreter and /work are kept between calls.

import { NotFound, WaitTimeout } from "./errors.js";

function sessionPath(id) {
  return "/v1/sessions/" + encodeURIComponent(id);
}

/**
 * A session of the API: run(code) runs the session's next call; variables,
 * imports, the current directory and files persist between calls. close()
 * ends it. A call's result is a job result plus seq, incarnation and
 * state_restored (false when the call found a fresh interpreter; session_note
 * says why and what to do).
 */
export class Session {
  constructor(client, data) {
    this._client = client;
    Object.assign(this, data);
  }

  /** Runs code as the session's next call and resolves to its result. One
   * Idempotency-Key rides every try, so a retry never runs the call twice. */
  async run(code, { timeoutMs, signal, idempotencyKey, ...call } = {}) {
    const c = this._client;
    const { specBody } = await import("./client.js");
    const body = specBody(code, call);
    const key = idempotencyKey || globalThis.crypto?.randomUUID?.() || (await import("node:crypto")).randomUUID();
    const poll = Math.min(c.longPollMs, timeoutMs ?? c.longPollMs);
    const wait = `${Math.max(0, Math.floor(poll))}ms`;
    const start = Date.now();
    let { status, data } = await c._call("POST", `${sessionPath(this.id)}/exec?wait=${wait}`, {
      body, headers: { "Idempotency-Key": key }, timeoutMs: c.timeoutMs + poll, signal,
    });
    while (status === 202) {
      if (timeoutMs !== undefined && Date.now() - start > timeoutMs) {
        throw new WaitTimeout(`kiln: call ${data?.seq} of session ${this.id} not finished within ${timeoutMs} ms`);
      }
      ({ status, data } = await c._call("GET", `${sessionPath(this.id)}/calls/${data.seq}?wait=${wait}`, {
        timeoutMs: c.timeoutMs + poll, signal,
      }));
    }
    return data;
  }

  /** A file of the session's /work as its last call left it. */
  async readFile(name, { signal } = {}) {
    const path = `${sessionPath(this.id)}/files/` + name.split("/").map(encodeURIComponent).join("/");
    const { resp, dl } = await this._client._open("GET", path, { headers: { Accept: "*/*" }, signal });
    try {
      return new Uint8Array(await resp.arrayBuffer());
    } finally {
      dl.done();
    }
  }

  /** Reads the session again. */
  async refresh({ signal } = {}) {
    const { data } = await this._client._call("GET", sessionPath(this.id), { signal });
    Object.assign(this, data);
    return this;
  }

  /** Ends the session and removes its sandbox. */
  async close({ signal } = {}) {
    try {
      const { data } = await this._client._call("DELETE", sessionPath(this.id), { signal });
      Object.assign(this, data);
    } catch (e) {
      if (!(e instanceof NotFound)) throw e;
      this.status = "ended";
    }
  }
}

/** Creates a session (see Client.session). */
export async function createSession(client, { runtime, signal, ...spec } = {}) {
  const { specBody } = await import("./client.js");
  const body = { ...spec };
  if (runtime) body.runtime = runtime;
  if (body.files) body.files = specBody("", { files: body.files }).files;
  const { data } = await client._call("POST", "/v1/sessions", { body, onlyUnsent: true, timeoutMs: client.timeoutMs + 120_000, signal });
  return new Session(client, data);
}

/** An existing session by id. */
export async function getSession(client, id, { signal } = {}) {
  const { data } = await client._call("GET", sessionPath(id), { signal });
  return new Session(client, data);
}
