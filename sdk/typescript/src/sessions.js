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
 * says why and what to do). Files: writeFile/upload, readFile/download,
 * listFiles, stat, exists, remove, mkdir and move work on the session's /work
 * between calls.
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
        throw new WaitTimeout(`kiln: call ${data?.seq} of session ${this.id} not finished within ${timeoutMs} ms`, data);
      }
      ({ status, data } = await c._call("GET", `${sessionPath(this.id)}/calls/${data.seq}?wait=${wait}`, {
        timeoutMs: c.timeoutMs + poll, signal,
      }));
    }
    return data;
  }

  /** Cancels call seq of the session (a run that rejected with WaitTimeout
   * names it in the error's job.seq, where the call stands): one still waiting behind the session's earlier calls is
   * withdrawn and never runs, a running one is interrupted (the interpreter
   * and its variables stay), one that ended is left as it is. Resolves to
   * the call's result: status "canceled", unless it ended first. A seq the
   * session has no call of rejects with NotFound. */
  async cancelCall(seq, { signal } = {}) {
    return this._commandCall("POST", `${sessionPath(this.id)}/calls/${Math.floor(Number(seq))}/cancel`, { signal });
  }

  // --- shell commands: calls of the session, run by /bin/sh -c in /work ---

  /** Sends a request that makes a call of the session and resolves to the
   * call's result (a 202 is read again at its seq); one Idempotency-Key
   * rides every try. */
  async _commandCall(method, path, { body, signal, waitMs } = {}) {
    const c = this._client;
    const key = globalThis.crypto?.randomUUID?.() || (await import("node:crypto")).randomUUID();
    const wait = `${Math.max(0, Math.floor(c.longPollMs))}ms`;
    if (waitMs === undefined) path += (path.includes("?") ? "&" : "?") + "wait=" + wait;
    let { status, data } = await c._call(method, path, {
      body, headers: { "Idempotency-Key": key }, timeoutMs: c.timeoutMs + c.longPollMs + (waitMs ?? 0), signal,
    });
    while (status === 202) {
      ({ status, data } = await c._call("GET", `${sessionPath(this.id)}/calls/${data.seq}?wait=${wait}`, {
        timeoutMs: c.timeoutMs + c.longPollMs, signal,
      }));
    }
    return data;
  }

  /** Runs the shell command line cmd in the session's sandbox (cwd /work)
   * as its next call and resolves to the call's result: its stdout, stderr
   * and exit_code are the command's, command says where it stands.
   * timeoutS ends it (status "timed_out"). With background the call ends at
   * once: command.id is for waitCommand, writeStdin and killCommand. stdin
   * (background only) keeps the command's stdin open for writeStdin;
   * without it its stdin is empty. */
  async command(cmd, { timeoutS, background, env, stdin, signal } = {}) {
    const body = { cmd };
    if (timeoutS !== undefined) body.timeout_s = timeoutS;
    if (background) body.background = true;
    if (stdin) body.stdin = true;
    if (env) body.env = env;
    return this._commandCall("POST", `${sessionPath(this.id)}/commands`, { body, signal });
  }

  /** Waits up to waitMs (at most a minute) for background command id to
   * end; its output so far is the result's stdout and stderr. An id the
   * interpreter does not hold rejects with NotFound. */
  async waitCommand(id, { waitMs = 0, signal } = {}) {
    const ms = Math.max(0, Math.floor(waitMs));
    return this._commandCall("GET", `${sessionPath(this.id)}/commands/${encodeURIComponent(id)}?wait=${ms}ms`, { signal, waitMs: ms });
  }

  /** Kills background command id (its process group). */
  async killCommand(id, { signal } = {}) {
    return this._commandCall("POST", `${sessionPath(this.id)}/commands/${encodeURIComponent(id)}/kill`, { signal });
  }

  /** Writes data (text, at most 64 KiB a write) to the stdin of background
   * command id (one started with stdin), then closes its stdin when close:
   * the command reads the end of its input. command.stdin says whether it is
   * still open. A stdin that is not open (never opened, closed, or no longer
   * read) rejects with Conflict (type urn:kiln:problem:stdin-closed); an
   * unknown id with NotFound. */
  async writeStdin(id, { data, close, signal } = {}) {
    const body = {};
    if (data) body.data = data;
    if (close) body.close = true;
    return this._commandCall("POST", `${sessionPath(this.id)}/commands/${encodeURIComponent(id)}/stdin`, { body, signal });
  }

  /** The session's background commands (the ones its interpreter holds,
   * running or ended), oldest first: each one's id, cmd and where it stands. */
  async listCommands({ signal } = {}) {
    const r = await this._commandCall("GET", `${sessionPath(this.id)}/commands`, { signal });
    return r?.commands ?? [];
  }

  // --- files: /work as the last call left it; changes ordered with the calls ---

  _filePath(name) {
    const parts = name.split("/");
    // URL resolution drops . and .. elements, escaped or not: a path holding
    // one goes as one escaped element, which the API refuses, naming it.
    if (parts.some((p) => p === "." || p === "..")) return `${sessionPath(this.id)}/files/` + encodeURIComponent(name);
    return `${sessionPath(this.id)}/files/` + parts.map(encodeURIComponent).join("/");
  }

  /** Sends a file operation until it is done: one Idempotency-Key rides every
   * try, and a 202 (it waits behind the session's calls) is asked again with
   * it, so the operation is done once. */
  async _fileOp(method, path, { body, signal } = {}) {
    const c = this._client;
    const key = globalThis.crypto?.randomUUID?.() || (await import("node:crypto")).randomUUID();
    const wait = `${Math.max(0, Math.floor(c.longPollMs))}ms`;
    path += (path.includes("?") ? "&" : "?") + "wait=" + wait;
    for (;;) {
      const { status, data } = await c._call(method, path, {
        body, headers: { "Idempotency-Key": key }, timeoutMs: c.timeoutMs + c.longPollMs, signal,
      });
      if (status !== 202) return data;
    }
  }

  /** A file of the session's /work as its last call left it (its bytes). */
  async readFile(name, { signal } = {}) {
    const { resp, dl } = await this._client._open("GET", this._filePath(name), { headers: { Accept: "*/*" }, signal });
    try {
      return new Uint8Array(await resp.arrayBuffer());
    } finally {
      dl.done();
    }
  }

  /** Writes data (bytes, or a string as UTF-8) as the file name of /work: its
   * parents are made, a file there is replaced; never written through a
   * symbolic link (FileConflict). Resolves to its entry. */
  async writeFile(name, data, { signal } = {}) {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : new Uint8Array(data);
    return this._fileOp("PUT", this._filePath(name), { body, signal });
  }

  /** Uploads the local file at localPath as name in /work (default: its base name). */
  async upload(localPath, name, { signal } = {}) {
    const { readFile } = await import("node:fs/promises");
    const { basename } = await import("node:path");
    return this.writeFile(name ?? basename(localPath), await readFile(localPath), { signal });
  }

  /** Saves the file name of /work as localPath (default: its base name, here); resolves to the path written. */
  async download(name, localPath, { signal } = {}) {
    const { writeFile } = await import("node:fs/promises");
    const out = localPath ?? name.split("/").pop();
    await writeFile(out, await this.readFile(name, { signal }));
    return out;
  }

  /** The entries of the directory path of /work ("" for /work itself; every
   * entry below it with recursive) as the last call left them, by path: every page. */
  async listFiles(path = "", { recursive = false, signal } = {}) {
    const out = [];
    let cursor = "";
    for (;;) {
      const q = new URLSearchParams();
      if (path) q.set("path", path.replace(/\/+$/, ""));
      if (recursive) q.set("recursive", "true");
      if (cursor) q.set("cursor", cursor);
      const qs = q.toString();
      const { data } = await this._client._call("GET", `${sessionPath(this.id)}/files` + (qs ? "?" + qs : ""), { signal });
      out.push(...(data.entries ?? []));
      cursor = data.next_cursor ?? "";
      if (!cursor) return out;
    }
  }

  /** Describes the entry name of /work: a file, a directory or a symbolic link. */
  async stat(name, { signal } = {}) {
    return (await this._client._call("GET", this._filePath(name) + "?stat=true", { signal })).data;
  }

  /** Whether /work holds name after the last call. */
  async exists(name, { signal } = {}) {
    try {
      await this.stat(name, { signal });
      return true;
    } catch (e) {
      if (e instanceof NotFound) return false;
      throw e;
    }
  }

  /** Removes the entry name of /work (a link, never its target; a directory
   * only when empty, or with recursive). */
  async remove(name, { recursive = false, signal } = {}) {
    await this._fileOp("DELETE", this._filePath(name) + (recursive ? "?recursive=true" : ""), { signal });
  }

  /** Makes the directory name (and its parents) in /work; one already there is fine. */
  async mkdir(name, { signal } = {}) {
    return this._fileOp("POST", `${sessionPath(this.id)}/files`, { body: { op: "mkdir", path: name }, signal });
  }

  /** Renames src to dst in /work (dst's parents made; with overwrite, what is
   * at dst is replaced); resolves to the entry at dst. */
  async move(src, dst, { overwrite = false, signal } = {}) {
    const body = { op: "move", path: src, to: dst };
    if (overwrite) body.overwrite = true;
    return this._fileOp("POST", `${sessionPath(this.id)}/files`, { body, signal });
  }

  /** Frees the session's sandbox and memory once the calls accepted before
   * have ended, keeping its id, files and call history; resolves once it is
   * paused (status "paused"). A paused session no longer counts among the
   * key's live sessions; resume() or its next call brings it back. */
  async pause({ timeoutMs, signal } = {}) {
    const c = this._client;
    const poll = Math.min(c.longPollMs, timeoutMs ?? c.longPollMs);
    const wait = `${Math.max(0, Math.floor(poll))}ms`;
    const start = Date.now();
    for (;;) {
      const { status, data } = await c._call("POST", `${sessionPath(this.id)}/pause?wait=${wait}`, {
        timeoutMs: c.timeoutMs + poll, signal,
      });
      if (data?.id) Object.assign(this, data);
      if (status !== 202) return this;
      if (timeoutMs !== undefined && Date.now() - start > timeoutMs) {
        throw new WaitTimeout(`kiln: session ${this.id} not paused within ${timeoutMs} ms (a call still running)`);
      }
    }
  }

  /** Brings a paused session back on a worker; restored then says what came
   * back: "memory" (its variables too), "files" (its /work files, not its
   * variables) or "files+replay" (its files, then its successful calls run
   * again). A session that is not paused is read as it is. */
  async resume({ signal } = {}) {
    const { data } = await this._client._call("POST", `${sessionPath(this.id)}/resume`, { signal });
    Object.assign(this, data);
    return this;
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
