// Tool-call helpers for model vendors' formats (Anthropic Messages, OpenAI Chat
// Completions and Responses): the tool definition, a tool call turned into a
// job, and a finished job turned into the vendor's tool-result block. The model
// decides what to do next from error.category and the fix_code_and_retry /
// retryable hints, never from parsing stderr.

export const ANTHROPIC = "anthropic";
export const OPENAI = "openai"; // Chat Completions: tools=[{type: "function", function: {...}}]
export const OPENAI_RESPONSES = "openai-responses"; // Responses API: tools=[{type: "function", name, ...}]
export const FORMATS = Object.freeze([ANTHROPIC, OPENAI, OPENAI_RESPONSES]);
export const MAX_TIMEOUT_S = 300;

/** Failure categories that changing the code can fix. */
export const FIXABLE_CATEGORIES = Object.freeze(["syntax_error", "runtime_error", "timeout", "memory_limit", "output_limit"]);

/** The JSON Schema of the tool's arguments. */
export function inputSchema(runtime = "python") {
  return {
    type: "object",
    properties: {
      code: { type: "string", description: `The ${runtime} program to run. Print what you need to see.` },
      stdin: { type: "string", description: "Text fed to the program's standard input." },
      files: {
        type: "array",
        description: "Input files placed in the working directory before the program starts.",
        items: {
          type: "object",
          properties: {
            name: { type: "string", description: "Relative path, e.g. data/in.csv" },
            content: { type: "string", description: "File content: UTF-8 text, or base64 with encoding=base64" },
            encoding: { type: "string", enum: ["utf-8", "base64"] },
          },
          required: ["name", "content"],
        },
      },
      timeout_s: { type: "number", minimum: 1, maximum: MAX_TIMEOUT_S, description: "Wall-clock limit in seconds (default 10)." },
    },
    required: ["code"],
  };
}

function description(runtime) {
  return `Run a ${runtime} program in an isolated sandbox (no network, read-only system, ` +
    "fresh for every call) and get its stdout, stderr, exit code and wall time. " +
    "Files the program writes to the directory in $KILN_OUTPUT_DIR come back as artifacts. " +
    "On failure the result gives an error category (syntax_error, runtime_error, timeout, " +
    "memory_limit, output_limit, ...) and whether fixing the code and retrying can help.";
}

function unknownFormat(format) {
  return new RangeError(`unknown tool format ${JSON.stringify(format)}: use one of ${FORMATS.join(", ")}`);
}

/** The tool definition of run_<runtime> in the vendor's tool schema. */
export function toolDefinition(format = ANTHROPIC, { runtime = "python", name } = {}) {
  name = name || `run_${runtime}`;
  const desc = description(runtime);
  const schema = inputSchema(runtime);
  if (format === ANTHROPIC) return { name, description: desc, input_schema: schema };
  if (format === OPENAI) return { type: "function", function: { name, description: desc, parameters: schema } };
  // strict defaults to true in the Responses API and would want every input required.
  if (format === OPENAI_RESPONSES) return { type: "function", name, description: desc, parameters: schema, strict: false };
  throw unknownFormat(format);
}

/** The tool call cannot be turned into a job; callId and format say how to answer it. */
export class ToolCallError extends Error {
  constructor(message, callId, format) {
    super(message);
    this.name = "ToolCallError";
    this.callId = callId;
    this.format = format;
  }
}

/**
 * Turn an Anthropic tool_use block or an OpenAI tool call (Chat Completions or
 * Responses) into {callId, name, format, arguments, spec}. The runtime comes
 * from the tool name (run_python → python) unless given.
 */
export function parseToolCall(call, { runtime } = {}) {
  let format, callId, name, args;
  if (call?.type === "tool_use") {
    [format, callId, name, args] = [ANTHROPIC, String(call.id ?? ""), String(call.name ?? ""), call.input];
  } else if (call?.type === "function_call") {
    [format, callId, name, args] = [OPENAI_RESPONSES, String(call.call_id ?? ""), String(call.name ?? ""), call.arguments];
  } else if (call?.function && typeof call.function === "object") {
    [format, callId, name, args] = [OPENAI, String(call.id ?? ""), String(call.function.name ?? ""), call.function.arguments];
  } else {
    throw new ToolCallError("not a tool call: expected an Anthropic tool_use block or an OpenAI tool call", "", ANTHROPIC);
  }
  if (typeof args === "string") {
    try {
      args = args.trim() ? JSON.parse(args) : {};
    } catch (e) {
      throw new ToolCallError(`the arguments of ${name} are not valid JSON: ${e.message}`, callId, format);
    }
  }
  if (!args || typeof args !== "object" || Array.isArray(args)) {
    throw new ToolCallError(`the arguments of ${name} must be a JSON object`, callId, format);
  }
  const { code, stdin, timeout_s: timeoutS } = args;
  if (typeof code !== "string" || !code.trim()) throw new ToolCallError(`${name} needs a non-empty string argument "code"`, callId, format);
  const spec = { code };
  const rt = runtime || (name.startsWith("run_") ? name.slice(4) : undefined);
  if (rt) spec.runtime = rt;
  if (typeof stdin === "string") spec.stdin = stdin;
  if (timeoutS !== undefined && timeoutS !== null) {
    if (typeof timeoutS !== "number" || !(timeoutS > 0)) throw new ToolCallError("timeout_s must be a positive number of seconds", callId, format);
    spec.limits = { timeout_ms: Math.floor(Math.min(timeoutS, MAX_TIMEOUT_S) * 1000) };
  }
  const files = [];
  for (const f of args.files ?? []) {
    if (!f || typeof f.name !== "string" || typeof f.content !== "string") {
      throw new ToolCallError('each file needs string "name" and "content"', callId, format);
    }
    files.push(f.encoding === "base64" ? { name: f.name, content: f.content, encoding: "base64" } : { name: f.name, content: f.content });
  }
  if (files.length) spec.files = files;
  return { callId, name, format, arguments: args, spec };
}

/** The JSON the model reads: output, exit code, wall time, and for a failure its
 * category with fix_code_and_retry and retryable; artifacts as links. */
/**
 * The body POST /v1/tool-calls takes for a model's tool call (the call itself,
 * in any of the three formats), with the call's format and id; runtime renames
 * the tool ("python-slim" → "run_python_slim").
 */
export function serverCall(call, { runtime } = {}) {
  const notCall = () => new ToolCallError("not a tool call: expected an Anthropic tool_use block or an OpenAI tool call", "", ANTHROPIC);
  if (call === null || typeof call !== "object") throw notCall();
  const nameFor = (n) => (runtime ? "run_" + runtime.replaceAll("-", "_") : n);
  if (call.type === "function_call") {
    return { format: OPENAI_RESPONSES, callId: String(call.call_id ?? ""), body: { ...call, name: nameFor(String(call.name ?? "")) } };
  }
  if (call.type === "tool_use") {
    return { format: ANTHROPIC, callId: String(call.id ?? ""), body: { ...call, name: nameFor(String(call.name ?? "")) } };
  }
  if (call.function !== null && typeof call.function === "object") {
    return { format: OPENAI, callId: String(call.id ?? ""), body: { ...call, function: { ...call.function, name: nameFor(String(call.function.name ?? "")) } } };
  }
  throw notCall();
}

export function resultPayload(job, { baseUrl = "" } = {}) {
  const out = { status: job.status, exit_code: job.exit_code ?? null, stdout: job.stdout ?? "", stderr: job.stderr ?? "", wall_ms: job.wall_ms ?? 0 };
  if (job.stdout_truncated || job.stderr_truncated) out.truncated = { stdout: !!job.stdout_truncated, stderr: !!job.stderr_truncated };
  if (job.error) {
    out.error = {
      category: job.error.category, message: job.error.message ?? "", retryable: !!job.error.retryable,
      fix_code_and_retry: FIXABLE_CATEGORIES.includes(job.error.category),
    };
  }
  if (job.artifacts?.length) {
    out.artifacts = job.artifacts.map((a) => {
      const item = { name: a.name, size: a.size ?? a.bytes ?? 0, content_type: a.content_type ?? "", sha256: a.sha256 ?? "" };
      if (baseUrl && job.id) {
        item.url = `${baseUrl.replace(/\/+$/, "")}/v1/jobs/${encodeURIComponent(job.id)}/artifacts/${encodeURIComponent(a.name)}`;
      }
      return item;
    });
  }
  return out;
}

function block(text, isError, callId, format) {
  if (format === ANTHROPIC) return { type: "tool_result", tool_use_id: callId, content: [{ type: "text", text }], is_error: isError };
  if (format === OPENAI) return { role: "tool", tool_call_id: callId, content: text };
  if (format === OPENAI_RESPONSES) return { type: "function_call_output", call_id: callId, output: text };
  throw unknownFormat(format);
}

/** The vendor's tool-result block for a finished job. is_error (Anthropic) is
 * set unless the job succeeded; OpenAI formats carry it in the JSON text. */
export function toolResult(job, callId, format = ANTHROPIC, { baseUrl = "" } = {}) {
  const payload = resultPayload(job, { baseUrl });
  const isError = job.status !== "succeeded";
  if (format !== ANTHROPIC) payload.is_error = isError;
  return block(JSON.stringify(payload), isError, callId, format);
}

/** A tool-result block for a call that could not run (bad arguments). */
export function errorResult(message, callId, format = ANTHROPIC) {
  const payload = { status: "invalid_request", error: { category: "invalid_request", message, retryable: false, fix_code_and_retry: true } };
  if (format !== ANTHROPIC) payload.is_error = true;
  return block(JSON.stringify(payload), true, callId, format);
}
