// Compiled (never run) by `npm run typecheck`: the declarations in
// src/index.d.ts must describe the surface as a TypeScript user writes it.
import { Client, ConnectionFailed, KilnError, NotFound, QueueFull, WaitTimeout, isTerminal, tools } from "../src/index.js";
import type { BatchItem, CallPending, CallResult, CommandState, FileInfo, Job, JobPage, JobSummary, KilnEvent, Submitted } from "../src/index.js";

export async function example(): Promise<void> {
  const kiln = new Client({ server: "http://127.0.0.1:8080", apiKey: "k", retry: { maxAttempts: 3 } });
  const sub: Submitted = await kiln.submit("print(1)", { idempotencyKey: "k1", limits: { timeout_ms: 5000 }, cache: false });
  const done: Job = await kiln.wait(sub.id, { timeoutMs: 60_000 });
  const ok: boolean = isTerminal(done) && done.status === "succeeded" && done.error?.category !== "syntax_error";
  const run = await kiln.run({ code: "print(2)", files: { "in.bin": new Uint8Array([1]) } }, { timeoutMs: 1000 });
  const fetched = await kiln.run({ code: "import urllib.request", network: { allow: ["api.example.org"] } });
  const refused: number = fetched.egress?.refused ?? 0;
  const hosts: string[] = fetched.egress?.records?.map((r) => `${r.host}:${r.port}`) ?? [];
  const items: BatchItem[] = await kiln.batch(["print(1)", { code: "print(2)" }]);
  const all: Job[] = await kiln.waitAll(items.flatMap((i) => (i.job ? [i.job.id] : [])));
  const bytes: Uint8Array = await kiln.artifact(run.id, run.artifacts?.[0] ?? "out.png");
  for await (const ev of kiln.events(run.id, { lastEventId: "3" })) {
    const e: KilnEvent = ev;
    if (e.type === "result") break;
  }
  const def = tools.toolDefinition("openai", { runtime: "python" });
  const block = await kiln.runToolCall({ type: "tool_use", id: "t", name: "run_python", input: { code: "print(1)" } });
  const item = await kiln.runToolCall({ type: "function_call", id: "fc_1", call_id: "c", name: "run_python", arguments: "{}", status: "completed" });
  if ("type" in item && item.type === "function_call_output" && typeof item.output !== "string") {
    const images: string[] = item.output.flatMap((p) => (p.type === "input_image" ? [p.image_url] : []));
  }
  const parsed = tools.parseToolCall({ id: "c", type: "function", function: { name: "run_python", arguments: "{}" } });
  const tr = tools.toolResult(done, parsed.callId, parsed.format, { baseUrl: kiln.server });
  try {
    await kiln.cancel(sub.id);
  } catch (e) {
    if (e instanceof QueueFull) console.log(e.retryAfter, e.temporary);
    else if (e instanceof ConnectionFailed) console.log(e.sent);
    else if (e instanceof WaitTimeout) console.log(e.job?.status);
    else if (e instanceof NotFound || e instanceof KilnError) console.log(e.status, e.type, e.field);
  }
  const tagged = await kiln.submit({ code: "print(3)", metadata: { team: "a" } });
  const team: string | undefined = tagged.metadata?.team;
  const page: JobPage = await kiln.listJobs({ status: "failed", tags: { team: "a" }, limit: 10 });
  const next: string | undefined = page.next_cursor;
  for await (const j of kiln.iterJobs({ createdAfter: new Date(0) })) {
    const s: JobSummary = j;
    console.log(s.id, s.status, s.exit_code, s.metadata);
  }
  const again: Submitted = await kiln.replay(done.id);
  const records = await kiln.audit({ kind: "replay", limit: 5 });
  const live = await kiln.sessions({ tags: { team: "a" } });
  const s = await kiln.session({ metadata: { team: "a" } });
  const call: CallResult = await s.run("print(1)");
  const waiting = (a: CallResult | CallPending): string => ("pending" in a ? `${a.status} ${a.seq}` : `${a.status} ${a.state_restored}`);
  console.log(ok, all.length, bytes.length, def, block, tr, refused, hosts, team, next, again.replay_of, records.length,
    live.length, waiting(call));
}

// A session's files.
export async function files(kiln: Client): Promise<void> {
  const s = await kiln.session();
  const up: FileInfo = await s.writeFile("a.txt", "text");
  const typ: "file" | "dir" | "symlink" = up.type;
  const list: FileInfo[] = await s.listFiles("", { recursive: true });
  await s.move("a.txt", "b.txt", { overwrite: true });
  await s.remove("b.txt", { recursive: false });
  const bytes: Uint8Array = await s.readFile("b.txt");
  const paused: "paused" | "ready" | "starting" | "moving" | "ended" = (await s.pause({ timeoutMs: 1000 })).status;
  const restored: "memory" | "files" | "files+replay" | "files+variables" | undefined = (await s.resume()).restored;
  const cr: CallResult = await s.command("ls -la", { timeoutS: 10, env: { A: "1" } });
  const bg = await s.command("sleep 5", { background: true });
  const running: boolean | undefined = (await s.waitCommand(bg.command?.id ?? "", { waitMs: 1000 })).command?.running;
  const code: number | undefined = (await s.killCommand(bg.command?.id ?? "")).command?.exit_code;
  const fed = await s.command("cat", { background: true, stdin: true });
  const open: boolean | undefined = (await s.writeStdin(fed.command?.id ?? "", { data: "x\n", close: true })).command?.stdin;
  const listed: CommandState[] = await s.listCommands({ signal: AbortSignal.timeout(1000) });
  const cmdLine: string | undefined = listed[0]?.cmd;
  void [cr, running, code, open, cmdLine, paused, restored, s.paused_at, typ, list, bytes, await s.mkdir("d"), await s.stat("d"), await s.exists("d"), await s.upload("/tmp/x"), await s.download("d/x")];
}
