// Types of Kiln's JavaScript client (src/*.js). Wire objects keep the API's
// snake_case field names, so they match the OpenAPI document and the JSON.

export type Status = "queued" | "running" | "succeeded" | "failed" | "timed_out" | "oom_killed" | "canceled" | "internal_error";
export type Category =
  | "syntax_error" | "runtime_error" | "timeout" | "memory_limit" | "output_limit" | "forbidden" | "invalid_request" | "internal" | "canceled" | "quota_exceeded"
  | (string & {});

export interface Limits {
  timeout_ms?: number;
  memory_mb?: number;
  cpu_ms?: number;
  pids?: number;
  output_bytes?: number;
  disk_mb?: number;
}

export interface InputFile {
  /** Relative path in the working directory, e.g. "data/in.csv". */
  name: string;
  /** UTF-8 text, base64 text with encoding "base64", or bytes (sent as base64). */
  content: string | Uint8Array;
  encoding?: "utf-8" | "base64";
}

export interface Spec {
  code: string;
  runtime?: string;
  stdin?: string;
  args?: string[];
  env?: Record<string, string>;
  /** An array, or a map of name to content. */
  files?: InputFile[] | Record<string, string | Uint8Array>;
  limits?: Limits;
  /** false: neither answer from nor store in the result cache. */
  cache?: boolean;
  /** A budget id (Client.createBudget) the run is charged to. */
  budget?: string;
  /** Hosts the job may reach through its egress proxy; absent: no network. */
  network?: Network;
}

export interface Network {
  /** "api.example.org", "*.data.gov" (names under it), an optional ":port" (else 80
   * and 443); each within the API key's egress allowance (else EgressNotAllowed).
   * A job with a network uses the result cache only when it sets `cache`. */
  allow: string[];
}

/** What a job with a network did through its egress proxy. */
export interface Egress {
  connections: number;
  refused: number;
  bytes_up: number;
  bytes_down: number;
  /** At most 64, in the order they ended; records_dropped counts the rest. */
  records?: EgressRecord[];
  records_dropped?: number;
}

/** One connection a job asked its egress proxy for. */
export interface EgressRecord {
  time: string;
  /** CONNECT (a TLS tunnel) or the plain HTTP request's method. */
  method: string;
  host: string;
  port: number;
  /** The address the proxy connected to. */
  addr?: string;
  allowed: boolean;
  /** Why it was refused or cut. */
  reason?: string;
  bytes_up: number;
  bytes_down: number;
  duration_ms: number;
}

export interface BudgetLimits {
  max_runs?: number;
  max_cpu_ms?: number;
  max_wall_ms?: number;
  max_artifact_bytes?: number;
}

export interface BudgetUse {
  runs: number;
  cpu_ms: number;
  wall_ms: number;
  artifact_bytes: number;
}

export interface Budget extends BudgetLimits {
  id: string;
  /** What the runs that ended used. */
  used: BudgetUse;
  /** What jobs accepted and not yet ended hold. */
  reserved: BudgetUse;
  created_at: string;
  expires_at: string;
}

export interface Failure {
  category: Category;
  message: string;
  retryable: boolean;
  /** The program's exception or syntax error as its launcher saw it (Python, Node). */
  exception?: ExceptionInfo;
}

export interface ExceptionInfo {
  type: string;
  message: string;
  line?: number;
  column?: number;
  source_line?: string;
  frames?: Array<{ file: string; line: number; function: string }>;
}

/** A display output (last expression, display(), a figure): a MIME bundle. */
export interface DisplayOutput {
  type: "execute_result" | "display_data";
  /** MIME type to value: text as strings, binary (image/png) base64, application/json any JSON. */
  data: { "text/plain": string; [mime: string]: unknown };
  /** MIME type to the artifact holding a value too long to carry inline. */
  artifacts?: Record<string, string>;
}

export interface Artifact {
  name: string;
  size?: number;
  sha256: string;
  content_type?: string;
}

/** A job as the API shows it: queued or running, or finished with its result. */
export interface Job {
  id: string;
  status: Status;
  exit_code?: number | null;
  signal?: string;
  stdout?: string;
  stderr?: string;
  stdout_base64?: string;
  stderr_base64?: string;
  stdout_truncated?: boolean;
  stderr_truncated?: boolean;
  stdout_bytes?: number;
  stderr_bytes?: number;
  wall_ms?: number;
  cpu_ms?: number;
  memory_peak_bytes?: number;
  queue_ms?: number;
  attempt?: number;
  worker?: string;
  cache_hit?: boolean;
  image?: { name: string; digest: string };
  error?: Failure;
  limits?: Limits;
  artifacts?: Artifact[];
  outputs?: DisplayOutput[];
  outputs_truncated?: boolean;
  outputs_dropped?: number;
  created_at?: string;
  started_at?: string;
  finished_at?: string;
  trace_id?: string;
  cancel_requested?: boolean;
  egress?: Egress;
  [field: string]: unknown;
}

/** What submit answers: the job, and whether it was accepted (202) rather than answered at once. */
export interface Submitted extends Job {
  accepted: boolean;
}

export interface BatchItem {
  index: number;
  /** The HTTP status this job got (202, 200, 422, ...). */
  status: number;
  job?: Submitted;
  error?: KilnError;
}

export interface RuntimeInfo {
  name: string;
  image?: string;
  digest?: string;
  [field: string]: unknown;
}

/** One Server-Sent Event of a job's live stream. */
export interface KilnEvent {
  /** "status", "stdout", "stderr", "artifacts", "result", ... */
  type: string;
  /** The event's JSON (for stdout/stderr: {data} or {data_base64}; for result: the Job). */
  data: any;
  id?: string;
}

/** Retries of 429, 502-504 and network errors: the n-th waits a random time between half and all of
 * min(maxBackoffMs, initialBackoffMs·multiplierⁿ), never less than the server's Retry-After. */
export interface RetryPolicy {
  /** Tries of one request, the first included. Default 8. */
  maxAttempts: number;
  /** Default 200. */
  initialBackoffMs: number;
  /** Default 10000. */
  maxBackoffMs: number;
  /** Default 2. */
  multiplier: number;
  /** No retry starts after this long. Default 60000. */
  maxElapsedMs: number;
}
export const retryDefaults: Readonly<RetryPolicy>;
export const NO_RETRY: Readonly<RetryPolicy>;
export function backoffMs(policy: RetryPolicy, n: number, retryAfterSeconds?: number): number;

export interface ClientOptions {
  /** Default $KILN_SERVER, else http://127.0.0.1:8080. */
  server?: string;
  /** Default $KILN_API_KEY. */
  apiKey?: string;
  /** Bounds each plain request; long-polls get their wait on top. Default 30000. */
  timeoutMs?: number;
  retry?: Partial<RetryPolicy>;
  /** How long one wait request is held by the server. Default 30000. */
  longPollMs?: number;
  /** A fetch implementation. Default globalThis.fetch. */
  fetch?: typeof globalThis.fetch;
}

export interface CallOptions {
  signal?: AbortSignal;
}

export interface SubmitOptions extends CallOptions, Omit<Partial<Spec>, "code"> {
  /** Default: a new UUID, reused by every retry of this call. */
  idempotencyKey?: string;
  /** Hold the answer until the job finishes or this passes. */
  waitMs?: number;
}

export interface RunOptions extends CallOptions, Omit<Partial<Spec>, "code"> {
  /** For submit and wait together; none: no limit. */
  timeoutMs?: number;
}

export declare const DEFAULT_SERVER: string;
export declare const USER_AGENT: string;
export function isTerminal(job: Pick<Job, "status"> | null | undefined): boolean;
export function specBody(codeOrSpec: string | Spec, extra?: Partial<Spec>): Record<string, unknown>;
export function parseSSE(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<KilnEvent, void, undefined>;

export declare class Client {
  constructor(options?: ClientOptions);
  readonly server: string;
  retry: RetryPolicy;
  longPollMs: number;
  timeoutMs: number;
  submit(codeOrSpec: string | Spec, options?: SubmitOptions): Promise<Submitted>;
  get(id: string, options?: CallOptions & { waitMs?: number }): Promise<Job>;
  /** Rejects with WaitTimeout after timeoutMs; survives API restarts and outages. */
  wait(id: string, options?: CallOptions & { timeoutMs?: number }): Promise<Job>;
  run(codeOrSpec: string | Spec, options?: RunOptions): Promise<Job>;
  cancel(id: string, options?: CallOptions): Promise<Job>;
  batch(specs: Array<string | Spec>, options?: CallOptions): Promise<BatchItem[]>;
  jobs(ids: string[], options?: CallOptions): Promise<Array<Job | null>>;
  waitAll(ids: string[], options?: CallOptions & { timeoutMs?: number }): Promise<Job[]>;
  runtimes(options?: CallOptions): Promise<RuntimeInfo[]>;
  /** The artifact's bytes, SHA-256 checked (IntegrityError on a mismatch). */
  artifact(id: string, artifact: string | Artifact, options?: CallOptions): Promise<Uint8Array>;
  events(id: string, options?: CallOptions & { lastEventId?: string; timeoutMs?: number; idleTimeoutMs?: number }): AsyncGenerator<KilnEvent, void, undefined>;
  runToolCall(call: tools.ToolCallInput, options?: CallOptions & { timeoutMs?: number; runtime?: string; budget?: string }): Promise<tools.ToolResultBlock>;
  /** An execution budget: jobs naming its id are refused (BudgetExhausted) once it cannot cover them. */
  createBudget(limits: BudgetLimits & { expires_s?: number }, options?: CallOptions): Promise<Budget>;
  getBudget(id: string, options?: CallOptions): Promise<Budget>;
  /** Creates a session: a sandbox whose interpreter and /work persist between calls. */
  session(spec?: SessionSpec & CallOptions): Promise<Session>;
  /** An existing session of this API key, by id. */
  getSession(id: string, options?: CallOptions): Promise<Session>;
}

export interface SessionSpec {
  runtime?: string;
  limits?: Spec["limits"];
  memory_mb?: number;
  idle_timeout_s?: number;
  max_lifetime_s?: number;
  files?: Spec["files"];
  restore?: "files" | "replay";
  /** Hosts every call may reach, within the API key's egress allowance (see Spec.network). */
  network?: Spec["network"];
}

/** One call of a session: a job's result plus where it stands in its session. */
export type CallResult = Job & {
  seq: number;
  incarnation: number;
  /** False when the call found a fresh interpreter; session_note says why. */
  state_restored: boolean;
  session_note?: string;
};

export declare class Session {
  readonly id: string;
  status: "starting" | "ready" | "moving" | "ended";
  runtime: string;
  incarnation: number;
  created_at: string;
  expires_at: string;
  ended_reason?: string;
  run(code: string, options?: CallOptions & { timeoutMs?: number; idempotencyKey?: string } & Partial<Pick<Spec, "stdin" | "args" | "env" | "files" | "limits" | "budget">>): Promise<CallResult>;
  readFile(name: string, options?: CallOptions): Promise<Uint8Array>;
  refresh(options?: CallOptions): Promise<Session>;
  close(options?: CallOptions): Promise<void>;
}

export interface KilnErrorOptions {
  status?: number;
  type?: string;
  title?: string;
  detail?: string;
  field?: string;
  limit?: number;
  retryAfter?: number;
  problem?: Record<string, unknown>;
  cause?: unknown;
}

export declare class KilnError extends Error {
  constructor(message: string, options?: KilnErrorOptions);
  /** HTTP status of the answer; 0 when there was none. */
  status: number;
  /** The problem type URN, e.g. "urn:kiln:problem:invalid-field". */
  type: string;
  title: string;
  detail: string;
  /** The offending input, e.g. "limits.memory_mb". */
  field: string;
  limit?: number;
  /** The server's Retry-After, in seconds. */
  retryAfter?: number;
  problem: Record<string, unknown>;
  /** True when the same request may succeed later unchanged. */
  readonly temporary: boolean;
}
export declare class InvalidRequest extends KilnError {}
export declare class PayloadTooLarge extends InvalidRequest {}
export declare class Unauthorized extends KilnError {}
export declare class NotFound extends KilnError {}
export declare class MethodNotAllowed extends KilnError {}
export declare class Conflict extends KilnError {}
/** 409: the budget the job names cannot cover it; retrying will not help. */
export declare class BudgetExhausted extends KilnError {}
/** 422: the job's network names a host the API key does not allow (or the key allows none). */
export declare class EgressNotAllowed extends InvalidRequest {}
export declare class RateLimited extends KilnError {}
export declare class QueueFull extends RateLimited {}
export declare class Unavailable extends KilnError {}
export declare class ServerError extends KilnError {}
export declare class ConnectionFailed extends KilnError {
  constructor(message: string, options?: KilnErrorOptions & { sent?: boolean });
  /** False when the request surely never reached the server. */
  sent: boolean;
}
export declare class WaitTimeout extends KilnError {
  constructor(message: string, job?: Job);
  job?: Job;
}
export declare class IntegrityError extends KilnError {}
export declare const PROBLEM_PREFIX: string;
export function errorClass(status: number, problemType?: string): typeof KilnError;
export function fromProblem(status: number, problem: Record<string, unknown>, retryAfterSeconds?: number): KilnError;

export namespace tools {
  type Format = "anthropic" | "openai" | "openai-responses";
  const ANTHROPIC: "anthropic";
  const OPENAI: "openai";
  const OPENAI_RESPONSES: "openai-responses";
  const FORMATS: readonly Format[];
  const MAX_TIMEOUT_S: number;
  const FIXABLE_CATEGORIES: readonly string[];

  /** An Anthropic tool_use block, an OpenAI Chat Completions tool call or a Responses function_call. */
  type ToolCallInput =
    | { type: "tool_use"; id: string; name: string; input: Record<string, unknown> }
    | { id: string; type: "function"; function: { name: string; arguments: string } }
    | { type: "function_call"; call_id: string; name: string; arguments: string; id?: string; status?: string };

  /** A tool result: the server's (runToolCall) carries images as Anthropic image
   * blocks or Responses input_image parts (a data URL); a Chat Completions tool
   * message is text only. toolResult/errorResult build text-only blocks locally. */
  type ToolResultBlock =
    | { type: "tool_result"; tool_use_id: string; is_error: boolean;
        content: Array<{ type: "text"; text: string } | { type: "image"; source: { type: "base64"; media_type: string; data: string } }> }
    | { role: "tool"; tool_call_id: string; content: string }
    | { type: "function_call_output"; call_id: string;
        output: string | Array<{ type: "input_text"; text: string } | { type: "input_image"; image_url: string }> };

  interface ParsedToolCall {
    callId: string;
    name: string;
    format: Format;
    arguments: Record<string, unknown>;
    spec: Spec;
  }

  function inputSchema(runtime?: string): Record<string, unknown>;
  function toolDefinition(format?: Format, options?: { runtime?: string; name?: string }): Record<string, unknown>;
  function parseToolCall(call: ToolCallInput | Record<string, unknown>, options?: { runtime?: string }): ParsedToolCall;
  function resultPayload(job: Job, options?: { baseUrl?: string }): Record<string, unknown>;
  function toolResult(job: Job, callId: string, format?: Format, options?: { baseUrl?: string }): ToolResultBlock;
  function errorResult(message: string, callId: string, format?: Format): ToolResultBlock;

  class ToolCallError extends Error {
    constructor(message: string, callId: string, format: Format);
    callId: string;
    format: Format;
  }
}
