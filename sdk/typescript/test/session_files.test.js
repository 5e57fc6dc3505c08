// A session's files, shell commands, pause and resume from the TypeScript SDK against a live Kiln: upload and
// download round trips, listing, stat, mkdir, move and remove, refusals as
// FileConflict (never retryable), and a link the session made never written
// through. Run by internal/e2e's TestSDKs (and TestSDKSessions alone).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Conflict, FileConflict, InvalidRequest, NotFound, WaitTimeout } from "../src/index.js";
import * as live from "./live.js";

test("a node session keeps globalThis, a required module and a file between calls", async (t) => {
  // Issue 36, acceptance 4.
  const c = live.client(t);
  if (!c) return;
  const s = await c.session({ runtime: "node" });
  t.after(() => s.close());
  assert.equal((await s.run("globalThis.n = 40\nconst fs = require('fs')\nfs.writeFileSync('n.txt', String(n))")).status, "succeeded");
  const r = await s.run("n += 2\nconsole.log(n, fs.readFileSync('n.txt', 'utf8'))");
  assert.deepEqual([r.status, r.stdout], ["succeeded", "42 40\n"]);
  assert.equal(new TextDecoder().decode(await s.readFile("n.txt")), "40");
});

test("a session's files: upload, download, list, stat, mkdir, move, remove", async (t) => {
  const c = live.client(t);
  if (!c) return;
  const tmp = await mkdtemp(join(tmpdir(), "kiln-files-"));
  const s = await c.session();
  try {
    const local = join(tmp, "data.csv");
    await writeFile(local, "a,b\n1,2\n");
    const up = await s.upload(local, "in/data.csv");
    assert.deepEqual([up.path, up.name, up.type, up.size, up.mode], ["in/data.csv", "data.csv", "file", 8, "0644"]);
    assert.equal(up.sha256, createHash("sha256").update("a,b\n1,2\n").digest("hex"));
    const r = await s.run("import pandas as pd\ndf = pd.read_csv('in/data.csv')\ndf['c'] = df.a + df.b\ndf.to_csv('out.csv', index=False)\nprint(int(df.c[0]))");
    assert.equal(r.stdout, "3\n");
    const back = await s.download("out.csv", join(tmp, "back.csv"));
    assert.equal(await readFile(back, "utf8"), "a,b,c\n1,2,3\n");
    await s.writeFile("bin/b.bin", new Uint8Array([0, 255, 10]));
    assert.deepEqual([...(await s.readFile("bin/b.bin"))], [0, 255, 10]);
    assert.equal((await s.mkdir("plots/2024")).type, "dir");
    assert.equal((await s.mkdir("plots/2024")).type, "dir"); // already there: fine
    const moved = await s.move("bin/b.bin", "plots/b.bin");
    assert.deepEqual([moved.path, moved.size], ["plots/b.bin", 3]);
    const top = Object.fromEntries((await s.listFiles()).map((e) => [e.path, e.type]));
    assert.deepEqual([top.in, top["out.csv"], top.plots, top["in/data.csv"]], ["dir", "file", "dir", undefined]);
    assert.deepEqual((await s.listFiles("plots", { recursive: true })).map((e) => e.path), ["plots/2024", "plots/b.bin"]);
    assert.ok((await s.stat("plots")).mtime);
    assert.equal(await s.exists("out.csv"), true);
    await assert.rejects(s.remove("plots"), (e) => e instanceof FileConflict && e.status === 409 && e.field === "path" && !e.temporary);
    await s.remove("plots", { recursive: true });
    assert.equal(await s.exists("plots"), false);
    await assert.rejects(s.remove("plots"), NotFound);
    await assert.rejects(s.mkdir("out.csv"), FileConflict);
    // A link the session made is never written through.
    await s.run("import os\nos.symlink('/etc/passwd', 'pw')");
    assert.equal((await s.stat("pw")).type, "symlink");
    await assert.rejects(s.writeFile("pw", "owned"), (e) => e instanceof FileConflict && e.detail.includes("symbolic link"));
    assert.ok(!(await s.run("print(open('/etc/passwd').read())")).stdout.includes("owned"));
    await assert.rejects(s.writeFile("a/../../x", "x"), (e) => e instanceof InvalidRequest && e.field === "path");
  } finally {
    await s.close();
    await rm(tmp, { recursive: true, force: true });
  }
});

test("a session paused and resumed keeps its files and variables; restored says what came back", async (t) => {
  const c = live.client(t);
  if (!c) return;
  const s = await c.session();
  try {
    await s.run("x = 1\nopen('kept.txt', 'w').write('kept')");
    assert.equal(await s.pause(), s);
    assert.equal(s.status, "paused");
    assert.ok(s.paused_at);
    assert.equal((await s.refresh()).status, "paused");
    assert.equal(await s.resume(), s);
    assert.deepEqual([s.status, s.restored], ["ready", "files+variables"]);
    const r = await s.run("print(open('kept.txt').read(), x)");
    assert.equal(r.stdout, "kept 1\n");
    assert.match(r.session_note, /variables came back/);
  } finally {
    await s.close();
  }
});

test("a session's shell commands: run, exit code, background waited on, fed a stdin, killed and listed", async (t) => {
  const c = live.client(t);
  if (!c) return;
  const s = await c.session();
  try {
    await s.writeFile("data/a.csv", "a\n1\n");
    let r = await s.command("pip list");
    assert.deepEqual([r.status, r.exit_code, r.command.running, r.command.exit_code], ["succeeded", 0, false, 0]);
    assert.ok(r.stdout.includes("pandas"));
    r = await s.command("ls -la data; echo $WHO >&2; exit 2", { env: { WHO: "me" } });
    assert.deepEqual([r.status, r.exit_code, r.stderr], ["failed", 2, "me\n"]);
    assert.ok(r.stdout.includes("a.csv"));
    assert.deepEqual(await s.listCommands(), []); // no background command yet
    // A call past its client's timeout, canceled by its seq; the interpreter stays.
    await s.run("x = 41");
    const late = await s.run("import time\nx = 7\ntime.sleep(120)", { timeoutMs: 1000 }).then(
      () => assert.fail("a 120 s call ended within 1 s"), (e) => { assert.ok(e instanceof WaitTimeout, String(e)); return e; });
    r = await s.cancelCall(late.job.seq);
    assert.deepEqual([r.status, r.seq], ["canceled", late.job.seq]);
    assert.equal((await s.run("print(x)")).stdout, "7\n");
    await assert.rejects(s.cancelCall(999), (e) => e instanceof NotFound);
    let bg = await s.command("echo hi; sleep 1; exit 4", { background: true });
    assert.deepEqual([bg.command.running, bg.command.id], [true, String(bg.seq)]);
    const first = bg.command.id;
    r = await s.waitCommand(bg.command.id, { waitMs: 30000 });
    assert.deepEqual([r.command.running, r.command.exit_code, r.stdout], [false, 4, "hi\n"]);
    bg = await s.command("exec sleep 300", { background: true });
    r = await s.killCommand(bg.command.id);
    assert.deepEqual([r.command.killed, r.command.running, r.command.exit_code], [true, false, 137]);
    await assert.rejects(s.waitCommand("999"), (e) => e instanceof NotFound && e.field === "cid");
    // A command with a stdin: written to twice, closed, it reads all of it and ends.
    const cat = await s.command("cat > fed.txt; echo fed", { background: true, stdin: true });
    assert.deepEqual([cat.command.running, cat.command.stdin], [true, true]);
    r = await s.writeStdin(cat.command.id, { data: "one\n" });
    assert.equal(r.command.stdin, true);
    r = await s.writeStdin(cat.command.id, { data: "two\n", close: true });
    assert.ok(!r.command.stdin);
    r = await s.waitCommand(cat.command.id, { waitMs: 30000 });
    assert.deepEqual([r.command.running, r.command.exit_code, r.stdout], [false, 0, "fed\n"]);
    assert.equal(new TextDecoder().decode(await s.readFile("fed.txt")), "one\ntwo\n");
    await assert.rejects(s.writeStdin(cat.command.id, { data: "late" }),
      (e) => e instanceof Conflict && e.status === 409 && e.type === "urn:kiln:problem:stdin-closed" && !e.temporary);
    await assert.rejects(s.writeStdin("999", { close: true }), (e) => e instanceof NotFound && e.field === "cid");
    // The list: every background command, oldest first, each where it stands.
    const listed = await s.listCommands();
    assert.deepEqual(listed.map((c) => [c.id, c.cmd, c.running, c.exit_code, c.stdin ?? false]), [
      [first, "echo hi; sleep 1; exit 4", false, 4, false],
      [bg.command.id, "exec sleep 300", false, 137, false],
      [cat.command.id, "cat > fed.txt; echo fed", false, 0, false],
    ]);
  } finally {
    await s.close();
  }
});
