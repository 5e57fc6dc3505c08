// The Kiln client: fetch-based, no dependencies.

import { ConnectionFailed, DecodeError, IntegrityError, InvalidRequest, KilnError, NotFound, WaitTimeout, fromProblem } from "./errors.js";
import { NO_RETRY, backoffMs, retryDefaults, sleep } from "./retry.js";
import { parseSSE } from "./sse.js";
import { TERMINAL_STATUSES } from "./schema.js";
import { MAX_TIMEOUT_S, errorResult, serverCall, ToolCallError } from "./tools.js";

export const DEFAULT_SERVER = "http://127.0.0.1:8080";
export const USER_AGENT = "kiln-typescript/0.1";

const TERMINAL = new Set(TERMINAL_STATUSES);

/** True once the job is in a terminal status. */
export function isTerminal(job) {
  return TERMINAL.has(job?.status);
}

function envVar(name) {
  return globalThis.process?.env?.[name] || undefined;
}

function jobPath(id) {
  // Escaped, so a malformed id gets the API's 400 instead of reaching another route.
  return "/v1/jobs/" + encodeURIComponent(id);
}

function waitParam(ms) {
  return `${Math.max(0, Math.floor(ms))}ms`;
}

function base64(bytes) {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

/** The wire form of a job: code with options, or a spec object. Files may be
 * an array or a {name: content} map; Uint8Array content is sent as base64. */
export function specBody(codeOrSpec, extra = {}) {
  const spec = typeof codeOrSpec === "string" ? { code: codeOrSpec, ...extra } : { ...codeOrSpec, ...extra };
  let files = spec.files;
  if (files && !Array.isArray(files)) files = Object.entries(files).map(([name, content]) => ({ name, content }));
  if (files) {
    spec.files = files.map((f) => (f.content instanceof Uint8Array ? { ...f, content: base64(f.content), encoding: "base64" } : f));
  }
  for (const k of Object.keys(spec)) if (spec[k] === undefined) delete spec[k];
  return spec;
}

function retryAfterOf(headers) {
  const v = headers.get("Retry-After");
  if (!v) return undefined;
  const n = Number(v);
  return Number.isFinite(n) && n >= 0 ? n : undefined;
}

// Web Crypto is a global from Node 19 on; Node 18 has it in node:crypto.
async function webCrypto() {
  return globalThis.crypto?.subtle ? globalThis.crypto : (await import("node:crypto")).webcrypto;
}

async function sha256Hex(bytes) {
  const { subtle } = await webCrypto();
  const d = new Uint8Array(await subtle.digest("SHA-256", bytes));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** An AbortController aborted by signal, or (unless ms is null) after ms. */
function deadline(ms, signal) {
  const ctl = new AbortController();
  const onAbort = () => ctl.abort(signal.reason);
  if (signal?.aborted) ctl.abort(signal.reason);
  signal?.addEventListener("abort", onAbort, { once: true });
  const t = ms == null ? undefined : setTimeout(() => ctl.abort(new Error(`no answer within ${ms}ms`)), ms);
  return { signal: ctl.signal, ctl, done: () => { clearTimeout(t); signal?.removeEventListener("abort", onAbort); } };
}

export class Client {
  /**
   * server and apiKey default to $KILN_SERVER (else http://127.0.0.1:8080) and
   * $KILN_API_KEY. timeoutMs bounds each plain request; long-polls get their
   * wait on top. retry paces retries of 429, 502-504 and network errors.
   * longPollMs is how long one wait request is held by the server.
   */
  constructor({ server, apiKey, timeoutMs = 30_000, retry, longPollMs = 30_000, fetch } = {}) {
    server = server || envVar("KILN_SERVER") || DEFAULT_SERVER;
    let u;
    try {
      u = new URL(server);
    } catch {
      u = undefined;
    }
    if (!u || (u.protocol !== "http:" && u.protocol !== "https:") || !u.host) {
      throw new TypeError(`kiln: server URL ${JSON.stringify(server)} must be http:// or https:// with a host`);
    }
    this.server = server.replace(/\/+$/, "");
    this.apiKey = apiKey === undefined ? envVar("KILN_API_KEY") : apiKey || undefined;
    this.timeoutMs = timeoutMs;
    this.retry = { ...retryDefaults, ...retry };
    this.longPollMs = longPollMs;
    this._fetch = fetch ?? globalThis.fetch.bind(globalThis);
  }

  // --- transport ----------------------------------------------------------

  /** One attempt; resolves to the 2xx Response with its deadline's done(), throws KilnError otherwise.
   * body is sent as JSON, or as it is when it is bytes (a Uint8Array: a session file's upload). */
  async _open(method, path, { body, headers, timeoutMs, signal } = {}) {
    const hdrs = { Accept: "application/json, application/problem+json", "User-Agent": USER_AGENT };
    const raw = body instanceof Uint8Array;
    if (body !== undefined) hdrs["Content-Type"] = raw ? "application/octet-stream" : "application/json";
    if (this.apiKey) hdrs.Authorization = "Bearer " + this.apiKey;
    Object.assign(hdrs, headers);
    const dl = deadline(timeoutMs === undefined ? this.timeoutMs : timeoutMs, signal);
    let resp;
    try {
      resp = await this._fetch(this.server + path, {
        method, headers: hdrs, body: body === undefined || raw ? body : JSON.stringify(body), signal: dl.signal,
      });
    } catch (e) {
      dl.done();
      if (signal?.aborted) throw signal.reason;
      throw this._network(method, path, e);
    }
    if (resp.ok) return { resp, dl };
    let text = "";
    try {
      text = await resp.text();
    } catch {
      // the answer's status is what matters
    } finally {
      dl.done();
    }
    let problem;
    try {
      problem = JSON.parse(text);
    } catch {
      problem = undefined;
    }
    if (!problem || typeof problem !== "object") problem = { title: resp.statusText || "Error", detail: text.trim().slice(0, 200) };
    throw fromProblem(resp.status, problem, retryAfterOf(resp.headers));
  }

  _network(method, path, e) {
    const code = e?.cause?.code ?? e?.code;
    const reason = e?.cause?.message ?? e?.message ?? String(e);
    return new ConnectionFailed(`kiln: ${method} ${this.server}${path}: ${reason}`, {
      sent: !(code === "ECONNREFUSED" || code === "ENOTFOUND"), cause: e,
    });
  }

  /** One attempt, the JSON answer read. */
  async _once(method, path, opts = {}) {
    const { resp, dl } = await this._open(method, path, opts);
    let text;
    try {
      text = await resp.text();
    } catch (e) {
      if (opts.signal?.aborted) throw opts.signal.reason;
      throw this._network(method, path, e);
    } finally {
      dl.done();
    }
    try {
      return { status: resp.status, data: text ? JSON.parse(text) : null, headers: resp.headers };
    } catch (e) {
      throw new DecodeError(`kiln: ${method} ${path}: the answer could not be decoded: ${e.name}: ${e.message}`, { status: resp.status, cause: e });
    }
  }

  /** _once with retries on temporary errors. onlyUnsent: retry network errors
   * only when the request surely was not sent (for requests that are not idempotent). */
  async _call(method, path, { onlyUnsent = false, retry, ...opts } = {}) {
    const policy = retry ?? this.retry;
    const start = Date.now();
    for (let attempt = 1; ; attempt++) {
      try {
        return await this._once(method, path, opts);
      } catch (e) {
        if (!(e instanceof KilnError) || !e.temporary || (onlyUnsent && e instanceof ConnectionFailed && e.sent)) throw e;
        const d = backoffMs(policy, attempt - 1, e.retryAfter);
        if (attempt >= policy.maxAttempts || Date.now() - start + d > policy.maxElapsedMs) throw e;
        await sleep(d, opts.signal);
      }
    }
  }

  // --- jobs ---------------------------------------------------------------

  /**
   * Submit one job; resolves at once (accepted true) unless waitMs is given.
   * Every submission carries an Idempotency-Key (a new UUID unless given) and
   * is retried with that same key, so a retry never creates a second job.
   */
  async submit(codeOrSpec, { idempotencyKey, waitMs, signal, ...spec } = {}) {
    const key = idempotencyKey || (await webCrypto()).randomUUID();
    let path = "/v1/jobs";
    let timeoutMs;
    if (waitMs) {
      path += "?wait=" + waitParam(waitMs);
      timeoutMs = this.timeoutMs + waitMs;
    }
    const { status, data } = await this._call("POST", path, {
      body: specBody(codeOrSpec, spec), headers: { "Idempotency-Key": key }, timeoutMs, signal,
    });
    return { ...data, accepted: status === 202 };
  }

  /** Read a job; with waitMs the server holds the answer until it finishes or waitMs passes. */
  async get(id, { waitMs, signal } = {}) {
    let path = jobPath(id);
    let timeoutMs;
    if (waitMs) {
      path += "?wait=" + waitParam(waitMs);
      timeoutMs = this.timeoutMs + waitMs;
    }
    return (await this._call("GET", path, { timeoutMs, signal })).data;
  }

  /**
   * Long-poll until the job finishes; rejects with WaitTimeout after timeoutMs
   * (none: no limit). Survives an API restart or outage: network errors, 429
   * and 502-504 are waited out with backoff and polling resumes.
   */
  async wait(id, { timeoutMs, signal } = {}) {
    const end = timeoutMs == null ? undefined : Date.now() + timeoutMs;
    let retries = 0;
    let last;
    for (;;) {
      const remaining = end === undefined ? undefined : end - Date.now();
      if (remaining !== undefined && remaining <= 0) throw new WaitTimeout(`kiln: job ${id} not finished within ${timeoutMs}ms`, last);
      const poll = remaining === undefined ? this.longPollMs : Math.max(1, Math.min(this.longPollMs, remaining));
      let delay;
      try {
        last = (await this._once("GET", jobPath(id) + "?wait=" + waitParam(poll), { timeoutMs: this.timeoutMs + poll, signal })).data;
        retries = 0;
        if (isTerminal(last)) return last;
        continue;
      } catch (e) {
        if (!(e instanceof KilnError) || !e.temporary) throw e;
        delay = backoffMs(this.retry, retries++, e.retryAfter);
      }
      if (end !== undefined) delay = Math.min(delay, Math.max(0, end - Date.now()));
      await sleep(delay, signal);
    }
  }

  /** Submit and wait for the result (timeoutMs in all; none: no limit). */
  async run(codeOrSpec, { timeoutMs, signal, ...spec } = {}) {
    const start = Date.now();
    const first = timeoutMs == null ? this.longPollMs : Math.min(this.longPollMs, timeoutMs);
    const res = await this.submit(codeOrSpec, { ...spec, waitMs: first, signal });
    if (isTerminal(res)) return res;
    const remaining = timeoutMs == null ? undefined : Math.max(0, timeoutMs - (Date.now() - start));
    return this.wait(res.id, { timeoutMs: remaining, signal });
  }

  /** Cancel a job: a queued one at once; a running one is asked to stop; a finished one stays. */
  async cancel(id, { signal } = {}) {
    return (await this._call("DELETE", jobPath(id), { signal })).data;
  }

  /**
   * Submit up to 100 jobs in one request; each item says what that job got.
   * Batches carry no idempotency key, so a network error is retried only when
   * the request surely never reached the server; 429/503 answers are retried.
   */
  async batch(specs, { signal } = {}) {
    const body = { jobs: specs.map((s) => specBody(s)) };
    const { data } = await this._call("POST", "/v1/jobs/batch", { body, onlyUnsent: true, signal });
    return (data?.jobs ?? []).map((it) => {
      const item = { index: it.index ?? 0, status: it.status ?? 0 };
      if (it.error) item.error = fromProblem(item.status, it.error);
      else if (it.job) item.job = { ...it.job, accepted: item.status === 202 };
      return item;
    });
  }

  /** Read up to 100 jobs at once, in order; an unknown id gives null. */
  async jobs(ids, { signal } = {}) {
    const q = ids.map(encodeURIComponent).join(",");
    const { data } = await this._call("GET", "/v1/jobs?ids=" + q, { signal });
    return (data?.jobs ?? []).map((j) => (j && j.status ? j : null));
  }

  /** Wait until every job finishes; results in the order of ids. Survives API restarts like wait(). */
  async waitAll(ids, { timeoutMs, signal } = {}) {
    const end = timeoutMs == null ? undefined : Date.now() + timeoutMs;
    const done = new Map();
    let retries = 0;
    for (;;) {
      let pending = ids.filter((id) => !done.has(id));
      if (!pending.length) return ids.map((id) => done.get(id));
      try {
        for (let i = 0; i < pending.length; i += 100) {
          const chunk = pending.slice(i, i + 100);
          const views = await this.jobs(chunk, { signal });
          views.forEach((v, j) => {
            if (!v) throw new NotFound(`kiln: job ${chunk[j]} not found`, { status: 404 });
            if (isTerminal(v)) done.set(chunk[j], v);
          });
        }
        pending = ids.filter((id) => !done.has(id));
        if (!pending.length) continue;
        const remaining = end === undefined ? undefined : end - Date.now();
        if (remaining !== undefined && remaining <= 0) {
          throw new WaitTimeout(`kiln: ${pending.length} of ${ids.length} jobs not finished within ${timeoutMs}ms`);
        }
        await this._once("GET", jobPath(pending[0]) + "?wait=" + waitParam(Math.min(this.longPollMs, remaining ?? Infinity)), {
          timeoutMs: this.timeoutMs + this.longPollMs, signal,
        });
        retries = 0;
      } catch (e) {
        if (!(e instanceof KilnError) || !e.temporary) throw e;
        if (end !== undefined && Date.now() >= end) throw new WaitTimeout(`kiln: jobs not finished within ${timeoutMs}ms`);
        await sleep(backoffMs(this.retry, retries++, e.retryAfter), signal);
      }
    }
  }

  /** The runtimes the fleet offers, with image digests and limits policies. */
  async runtimes({ signal } = {}) {
    return (await this._call("GET", "/v1/runtimes", { signal })).data?.runtimes ?? [];
  }

  // --- artifacts ----------------------------------------------------------

  /**
   * Download an artifact's bytes. The content's SHA-256 is checked against the
   * listed hash (when given an artifact object) or the ETag the server sent;
   * a mismatch throws IntegrityError.
   */
  async artifact(id, artifact, { signal } = {}) {
    const name = typeof artifact === "string" ? artifact : artifact.name;
    const expected = typeof artifact === "string" ? "" : artifact.sha256 ?? "";
    const path = jobPath(id) + "/artifacts/" + encodeURIComponent(name);
    for (let retries = 0; ; retries++) {
      try {
        const { resp, dl } = await this._open("GET", path, { headers: { Accept: "*/*" }, signal });
        let bytes;
        try {
          bytes = new Uint8Array(await resp.arrayBuffer());
        } catch (e) {
          throw this._network("GET", path, e);
        } finally {
          dl.done();
        }
        let etag = (resp.headers.get("ETag") ?? "").trim().replace(/^"|"$/g, "");
        if (etag.startsWith("W/")) etag = "";
        let want = (expected || etag).toLowerCase();
        if (want.startsWith("sha256:")) want = want.slice("sha256:".length);
        const got = await sha256Hex(bytes);
        if (want && got !== want) throw new IntegrityError(`kiln: artifact ${JSON.stringify(name)}: sha256 ${got}, expected ${want}`);
        return bytes;
      } catch (e) {
        if (!(e instanceof KilnError) || !e.temporary || retries + 1 >= this.retry.maxAttempts) throw e;
        await sleep(backoffMs(this.retry, retries, e.retryAfter), signal);
      }
    }
  }

  // --- live output ----------------------------------------------------------

  /**
   * Iterate over the job's live events ({type, data, id}: status, stdout,
   * stderr, artifacts, result). Ends after the result event. When the
   * connection breaks (or the API restarts) it reconnects with Last-Event-ID.
   * timeoutMs bounds the whole iteration (WaitTimeout); idleTimeoutMs a
   * silence on the connection.
   */
  async *events(id, { lastEventId, timeoutMs, idleTimeoutMs = 75_000, signal } = {}) {
    const end = timeoutMs == null ? undefined : Date.now() + timeoutMs;
    let last = lastEventId;
    let retries = 0;
    for (;;) {
      const headers = { Accept: "text/event-stream", "Cache-Control": "no-cache" };
      if (last !== undefined) headers["Last-Event-ID"] = last;
      let err;
      let opened;
      try {
        opened = await this._open("GET", jobPath(id) + "/events", { headers, timeoutMs: null, signal });
      } catch (e) {
        if (!(e instanceof KilnError) || !e.temporary) throw e;
        err = e;
      }
      if (opened) {
        const { resp, dl } = opened;
        let idle;
        const arm = () => {
          clearTimeout(idle);
          idle = setTimeout(() => dl.ctl.abort(new Error("event stream idle")), idleTimeoutMs);
        };
        async function* watched(body) {
          arm();
          for await (const chunk of body) {
            arm();
            yield chunk;
          }
        }
        try {
          for await (const ev of parseSSE(watched(resp.body))) {
            retries = 0;
            if (ev.id !== undefined) last = ev.id;
            yield ev;
            if (ev.type === "result") return;
          }
        } catch (e) {
          if (signal?.aborted) throw signal.reason;
          // the connection broke: reconnect below
        } finally {
          clearTimeout(idle);
          dl.done();
          dl.ctl.abort();
        }
      }
      if (end !== undefined && Date.now() >= end) throw new WaitTimeout(`kiln: events of job ${id} did not end within ${timeoutMs}ms`);
      let delay = backoffMs(this.retry, retries++, err?.retryAfter);
      if (end !== undefined) delay = Math.min(delay, Math.max(0, end - Date.now()));
      await sleep(delay, signal);
    }
  }

  // --- listing, replay, audit ----------------------------------------------

  /** A page of this API key's jobs, newest first (GET /v1/jobs), filtered by
   * status, metadata (tags: every pair must hold) and creation time; pass the
   * page's next_cursor as cursor for the next one. */
  async listJobs({ status, tags, createdAfter, createdBefore, cursor, limit, signal } = {}) {
    const q = new URLSearchParams();
    if (status) q.set("status", status);
    if (createdAfter) q.set("created_after", createdAfter instanceof Date ? createdAfter.toISOString() : createdAfter);
    if (createdBefore) q.set("created_before", createdBefore instanceof Date ? createdBefore.toISOString() : createdBefore);
    for (const [k, v] of Object.entries(tags ?? {})) q.append("tag", `${k}=${v}`);
    if (cursor) q.set("cursor", cursor);
    if (limit) q.set("limit", String(limit));
    return (await this._call("GET", "/v1/jobs?" + q, { signal })).data;
  }

  /** Every job listJobs(filters) would list, page after page. */
  async *iterJobs(filters = {}) {
    let cursor = filters.cursor;
    for (;;) {
      const page = await this.listJobs({ ...filters, cursor });
      yield* page.jobs;
      if (!page.next_cursor) return;
      cursor = page.next_cursor;
    }
  }

  /** Queues job id again as it ran (same code, inputs, limits and image digest);
   * the new job's replay_of names it. Not retried: each call queues a job. */
  async replay(id, { signal } = {}) {
    const { status, data } = await this._call("POST", jobPath(id) + "/replay", { signal, retry: NO_RETRY });
    return { ...data, accepted: status === 202 };
  }

  /** This API key's audit records (GET /v1/audit), oldest first: from since on,
   * of kind, at most limit. */
  async audit({ since, kind, limit, signal } = {}) {
    const q = new URLSearchParams();
    if (since) q.set("since", since instanceof Date ? since.toISOString() : since);
    if (kind) q.set("kind", kind);
    if (limit) q.set("limit", String(limit));
    const qs = q.toString();
    return (await this._call("GET", "/v1/audit" + (qs ? "?" + qs : ""), { signal })).data.records ?? [];
  }

  // --- budgets --------------------------------------------------------------

  /** Create an execution budget: jobs naming its id (spec.budget) are refused with
   * BudgetExhausted once it cannot cover them. */
  async createBudget(limits, { signal } = {}) {
    return (await this._call("POST", "/v1/budgets", { body: { ...limits }, signal })).data;
  }

  /** A budget with what its runs used (used) and what jobs in flight hold (reserved). */
  async getBudget(id, { signal } = {}) {
    return (await this._call("GET", "/v1/budgets/" + encodeURIComponent(id), { signal })).data;
  }

  // --- tools ----------------------------------------------------------------

  /** Creates a session: a sandbox whose interpreter and /work persist between
   * calls ({runtime, limits, memory_mb, idle_timeout_s, max_lifetime_s, files, restore,
   * network, metadata}). */
  async session(spec = {}) {
    const { createSession } = await import("./sessions.js");
    return createSession(this, spec);
  }

  /** An existing session of this API key, by id. */
  async getSession(id, opts = {}) {
    const { getSession } = await import("./sessions.js");
    return getSession(this, id, opts);
  }

  /** This API key's live sessions, oldest first; with tags, those whose
   * metadata holds every pair. */
  async sessions({ tags, signal } = {}) {
    const { Session } = await import("./sessions.js");
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(tags ?? {})) q.append("tag", `${k}=${v}`);
    const qs = q.toString();
    const { data } = await this._call("GET", "/v1/sessions" + (qs ? "?" + qs : ""), { signal });
    return (data.sessions ?? []).map((d) => new Session(this, d));
  }

  /**
   * Run a model's tool call (Anthropic tool_use block, OpenAI Chat Completions
   * tool call, or OpenAI Responses function_call) and return the tool-result
   * block in the same format. The call goes to POST /v1/tool-calls and the block
   * is the server's, exactly: the same text (stdout, stderr, display outputs, the
   * exception) and images as the API and `kiln mcp` give (Anthropic image blocks,
   * Responses input_image parts; a Chat Completions tool message is text only,
   * ending with where the images are). `budget` names the execution budget the
   * run is charged to (BudgetExhausted once it is used up).
   */
  async runToolCall(call, { timeoutMs, runtime, budget, signal } = {}) {
    let req;
    try {
      req = serverCall(call, { runtime });
    } catch (e) {
      if (e instanceof ToolCallError) return errorResult(e.message, e.callId, e.format);
      throw e;
    }
    const key = (await webCrypto()).randomUUID();
    const path = "/v1/tool-calls" + (budget ? "?budget=" + encodeURIComponent(budget) : "");
    const { data } = await this._call("POST", path, {
      body: req.body, headers: { "Idempotency-Key": key }, signal,
      timeoutMs: this.timeoutMs + (timeoutMs ?? (MAX_TIMEOUT_S + 60) * 1000),
    });
    return data;
  }
}
