"""The API's wire types and tables, from its OpenAPI document.

Generated from producer/openapi.json by internal/sdkgen (make sdk); do not edit.

Each object schema of the document is a TypedDict of the same name (keys as the
JSON has them; REQUIRED lists the keys an answer always holds); enums are Literal
types and tuples; ERROR_CLASS_BY_TYPE and ERROR_CLASS_BY_STATUS name the exception
class (kiln.errors) of each problem type and HTTP status.
"""
from __future__ import annotations

from typing import Any, Dict, List, Literal, TypedDict, Union

PROBLEM_PREFIX = "urn:kiln:problem:"

STATUSES = ("queued", "running", "succeeded", "failed", "timed_out", "oom_killed", "canceled", "internal_error")
PENDING_STATUSES = ("queued", "running")
TERMINAL_STATUSES = ("succeeded", "failed", "timed_out", "oom_killed", "canceled", "internal_error")
CATEGORIES = ("syntax_error", "runtime_error", "timeout", "memory_limit", "output_limit", "forbidden", "invalid_request", "canceled", "internal", "quota_exceeded")
PROBLEM_TYPES = ("urn:kiln:problem:malformed-json", "urn:kiln:problem:unknown-field", "urn:kiln:problem:unsupported-media-type", "urn:kiln:problem:body-too-large", "urn:kiln:problem:invalid-field", "urn:kiln:problem:batch-too-large", "urn:kiln:problem:invalid-parameter", "urn:kiln:problem:invalid-id", "urn:kiln:problem:not-found", "urn:kiln:problem:method-not-allowed", "urn:kiln:problem:idempotency-key-reused", "urn:kiln:problem:unauthorized", "urn:kiln:problem:queue-full", "urn:kiln:problem:unavailable", "urn:kiln:problem:internal", "urn:kiln:problem:duplicate-field", "urn:kiln:problem:field-name-case", "urn:kiln:problem:busy", "urn:kiln:problem:quota-exceeded:max_queued", "urn:kiln:problem:quota-exceeded:submissions_per_second", "urn:kiln:problem:quota-exceeded:cpu_seconds_per_day", "urn:kiln:problem:response-too-large", "urn:kiln:problem:budget-exhausted", "urn:kiln:problem:replay-unavailable", "urn:kiln:problem:session-ended", "urn:kiln:problem:quota-exceeded:sessions", "urn:kiln:problem:quota-exceeded:session_memory", "urn:kiln:problem:egress-not-allowed", "urn:kiln:problem:file-conflict", "urn:kiln:problem:stdin-closed")
TOOL_FORMATS = ("anthropic", "openai", "openai-responses")

ERROR_CLASS_BY_TYPE = {
    "malformed-json": "InvalidRequest",
    "unknown-field": "InvalidRequest",
    "unsupported-media-type": "InvalidRequest",
    "body-too-large": "PayloadTooLarge",
    "invalid-field": "InvalidRequest",
    "batch-too-large": "InvalidRequest",
    "invalid-parameter": "InvalidRequest",
    "invalid-id": "InvalidRequest",
    "not-found": "NotFound",
    "method-not-allowed": "MethodNotAllowed",
    "idempotency-key-reused": "Conflict",
    "unauthorized": "Unauthorized",
    "queue-full": "QueueFull",
    "unavailable": "Unavailable",
    "internal": "ServerError",
    "duplicate-field": "InvalidRequest",
    "field-name-case": "InvalidRequest",
    "busy": "Unavailable",
    "quota-exceeded:max_queued": "QuotaExceeded",
    "quota-exceeded:submissions_per_second": "QuotaExceeded",
    "quota-exceeded:cpu_seconds_per_day": "QuotaExceeded",
    "response-too-large": "ResponseTooLarge",
    "budget-exhausted": "BudgetExhausted",
    "replay-unavailable": "ReplayUnavailable",
    "session-ended": "SessionEnded",
    "quota-exceeded:sessions": "QuotaExceeded",
    "quota-exceeded:session_memory": "QuotaExceeded",
    "egress-not-allowed": "EgressNotAllowed",
    "file-conflict": "FileConflict",
    "stdin-closed": "Conflict",
}

ERROR_CLASS_BY_STATUS = {
    400: "InvalidRequest",
    401: "Unauthorized",
    403: "Unauthorized",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "SessionEnded",
    413: "PayloadTooLarge",
    415: "InvalidRequest",
    422: "InvalidRequest",
    429: "RateLimited",
    503: "Unavailable",
}

ERROR_CLASSES = ("BudgetExhausted", "Conflict", "EgressNotAllowed", "FileConflict", "InvalidRequest", "MethodNotAllowed", "NotFound", "PayloadTooLarge", "QueueFull", "QuotaExceeded", "RateLimited", "ReplayUnavailable", "ResponseTooLarge", "ServerError", "SessionEnded", "Unauthorized", "Unavailable")

# A job. Unknown fields are rejected, and so are field names in another case than
# documented ("CODE") and keys given twice in one object (400, types field-name-case and
# duplicate-field).
Spec = TypedDict("Spec", {
    "runtime": str,
    "code": str,
    "stdin": str,
    "args": List[str],
    "env": Dict[str, str],
    "files": List["File"],
    "limits": "Limits",
    "cache": Union[bool, "CacheMaxAge"],
    "budget": str,
    "network": "Network",
    "metadata": "Metadata",
}, total=False)

File = TypedDict("File", {
    "name": str,
    "content": str,
    "encoding": Literal["", "utf-8", "utf8", "base64"],
}, total=False)

# Zero or absent fields take the server default; values above the maximum are refused.
Limits = TypedDict("Limits", {
    "timeout_ms": int,
    "memory_mb": int,
    "cpu_ms": int,
    "pids": int,
    "output_bytes": int,
    "disk_mb": int,
}, total=False)

Policy = TypedDict("Policy", {
    "default": "Limits",
    "max": "Limits",
    "min": "Limits",
}, total=False)

RuntimeInfo = TypedDict("RuntimeInfo", {
    "name": str,
    "image": str,
    "digest": str,
    "limits": "Policy",
    "language": str,
    "version": str,
    "main_file": str,
    "reserved_files": List[str],
    "reserved_env": List[str],
    "default_limits": "Limits",
    "packages": List[Dict[str, Any]],
    "sessions": bool,
}, total=False)

Status = Literal["queued", "running", "succeeded", "failed", "timed_out", "oom_killed", "canceled", "internal_error"]

Links = TypedDict("Links", {
    "self": str,
    "wait": str,
}, total=False)

# A job that is not terminal.
Accepted = TypedDict("Accepted", {
    "id": str,
    "status": "PendingStatus",
    "created_at": str,
    "started_at": str,
    "attempt": int,
    "worker": str,
    "trace_id": str,
    "cancel_requested": bool,
    "links": "Links",
    "callback": "CallbackState",
    "metadata": "Metadata",
}, total=False)

Failure = TypedDict("Failure", {
    "category": Literal["syntax_error", "runtime_error", "timeout", "memory_limit", "output_limit", "forbidden", "invalid_request", "canceled", "internal", "quota_exceeded"],
    "message": str,
    "retryable": bool,
    "exception": "Exception",
}, total=False)

# A terminal job. stdout/stderr are valid UTF-8 (invalid bytes replaced by U+FFFD, the
# exact bytes then in *_base64).
Result = TypedDict("Result", {
    "id": str,
    "status": "TerminalStatus",
    "exit_code": int,
    "signal": str,
    "stdout": str,
    "stderr": str,
    "stdout_base64": str,
    "stderr_base64": str,
    "stdout_truncated": bool,
    "stderr_truncated": bool,
    "stdout_bytes": int,
    "stderr_bytes": int,
    "wall_ms": int,
    "cpu_ms": int,
    "memory_peak_bytes": int,
    "image": Dict[str, Any],
    "error": "Failure",
    "limits": "Limits",
    "artifacts": List["Artifact"],
    "artifacts_skipped": List["SkippedArtifact"],
    "artifacts_skipped_count": int,
    "redactions": Dict[str, int],
    "egress": "Egress",
    "replay_of": str,
    "replay": Dict[str, Any],
    "queue_ms": int,
    "attempt": int,
    "worker": str,
    "cache_hit": bool,
    "created_at": str,
    "started_at": str,
    "finished_at": str,
    "trace_id": str,
    "callback": "CallbackState",
    "metadata": "Metadata",
    "links": "Links",
    "outputs": List["DisplayOutput"],
    "outputs_truncated": bool,
    "outputs_dropped": int,
}, total=False)

BatchItem = TypedDict("BatchItem", {
    "index": int,
    "status": int,
    "job": "Job",
    "error": "Problem",
}, total=False)

ListError = TypedDict("ListError", {
    "id": str,
    "error": "Problem",
}, total=False)

# A file the job left in its output dir (/work/out), stored content-addressed.
Artifact = TypedDict("Artifact", {
    "name": str,
    "size": int,
    "sha256": str,
    "content_type": str,
}, total=False)

# An entry of the output dir that was not kept.
SkippedArtifact = TypedDict("SkippedArtifact", {
    "name": str,
    "size": int,
    "reason": Literal["not_regular_file", "file_too_large", "total_too_large", "too_many_files", "bad_name", "read_error"],
}, total=False)

StatusEvent = TypedDict("StatusEvent", {
    "status": "Status",
    "worker": str,
}, total=False)

# A chunk of output: UTF-8 text in data, or, when not valid UTF-8, its exact bytes in
# data_base64.
OutputEvent = TypedDict("OutputEvent", {
    "data": str,
    "data_base64": str,
}, total=False)

# The data of an output_skipped event: bytes of stream the live view left out at this
# point, because the program wrote them faster than output events carry (at most 1 MiB is
# held per stream between events). The result's stdout or stderr has them, up to the job's
# output_bytes.
SkippedEvent = TypedDict("SkippedEvent", {
    "stream": Literal["stdout", "stderr"],
    "bytes": int,
}, total=False)

# RFC 9457 problem details.
Problem = TypedDict("Problem", {
    "type": Literal["urn:kiln:problem:malformed-json", "urn:kiln:problem:unknown-field", "urn:kiln:problem:unsupported-media-type", "urn:kiln:problem:body-too-large", "urn:kiln:problem:invalid-field", "urn:kiln:problem:batch-too-large", "urn:kiln:problem:invalid-parameter", "urn:kiln:problem:invalid-id", "urn:kiln:problem:not-found", "urn:kiln:problem:method-not-allowed", "urn:kiln:problem:idempotency-key-reused", "urn:kiln:problem:unauthorized", "urn:kiln:problem:queue-full", "urn:kiln:problem:unavailable", "urn:kiln:problem:internal", "urn:kiln:problem:duplicate-field", "urn:kiln:problem:field-name-case", "urn:kiln:problem:busy", "urn:kiln:problem:quota-exceeded:max_queued", "urn:kiln:problem:quota-exceeded:submissions_per_second", "urn:kiln:problem:quota-exceeded:cpu_seconds_per_day", "urn:kiln:problem:response-too-large", "urn:kiln:problem:budget-exhausted", "urn:kiln:problem:replay-unavailable", "urn:kiln:problem:session-ended", "urn:kiln:problem:quota-exceeded:sessions", "urn:kiln:problem:quota-exceeded:session_memory", "urn:kiln:problem:egress-not-allowed", "urn:kiln:problem:file-conflict", "urn:kiln:problem:stdin-closed"],
    "title": str,
    "status": int,
    "detail": str,
    "field": str,
    "limit": int,
    "checks": Dict[str, str],
}, total=False)

# Statuses of a job that has not finished.
PendingStatus = Literal["queued", "running"]

# Statuses of a finished job; they never change once written.
TerminalStatus = Literal["succeeded", "failed", "timed_out", "oom_killed", "canceled", "internal_error"]

# A job: a Result when finished, an Accepted (pending) job when queued or running;
# `status` tells which.
Job = Union["Result", "Accepted"]

# The tool schema: anthropic (Messages API), openai (Chat Completions), openai-responses
# (Responses API).
ToolFormat = Literal["anthropic", "openai", "openai-responses"]

# Anthropic Messages API tool definition.
AnthropicTool = TypedDict("AnthropicTool", {
    "name": str,
    "description": str,
    "input_schema": Dict[str, Any],
}, total=False)

# OpenAI Chat Completions tool definition.
OpenAITool = TypedDict("OpenAITool", {
    "type": Literal["function"],
    "function": Dict[str, Any],
}, total=False)

# OpenAI Responses API function tool (flat). strict is false: the input's optional members
# (stdin, files, timeout_s) are not allowed in strict mode.
OpenAIResponsesTool = TypedDict("OpenAIResponsesTool", {
    "type": Literal["function"],
    "name": str,
    "description": str,
    "parameters": Dict[str, Any],
    "strict": Literal[False],
}, total=False)

ToolList = TypedDict("ToolList", {
    "format": "ToolFormat",
    "tools": List[Union["AnthropicTool", "OpenAITool", "OpenAIResponsesTool"]],
}, total=False)

# An Anthropic tool_use content block, as the model returned it.
AnthropicToolUse = TypedDict("AnthropicToolUse", {
    "type": Literal["tool_use"],
    "id": str,
    "name": str,
    "input": Dict[str, Any],
}, total=False)

# An OpenAI Chat Completions tool call (an element of message.tool_calls), as the model
# returned it.
OpenAIToolCall = TypedDict("OpenAIToolCall", {
    "id": str,
    "type": Literal["function"],
    "function": Dict[str, Any],
}, total=False)

# An OpenAI Responses API function_call output item, as the model returned it. The answer
# names call_id; id (the item's own) and status are ignored.
OpenAIResponsesFunctionCall = TypedDict("OpenAIResponsesFunctionCall", {
    "type": Literal["function_call"],
    "call_id": str,
    "name": str,
    "arguments": str,
    "id": str,
    "status": str,
}, total=False)

# A run tool's input (GET /v1/tools gives it per runtime as input_schema / parameters).
ToolInput = TypedDict("ToolInput", {
    "code": str,
    "stdin": str,
    "files": List["File"],
    "timeout_s": float,
}, total=False)

# An Anthropic tool_result content block: a text block (status, exit_code, wall_time_ms,
# stdout, stderr, display outputs; on failure error_category,
# retry_with_changed_code_can_help, retry_same_call_can_help, the exception; artifact
# links), then the images (display outputs' images, then image artifacts up to 5 MiB) as
# base64 image blocks.
AnthropicToolResult = TypedDict("AnthropicToolResult", {
    "type": Literal["tool_result"],
    "tool_use_id": str,
    "is_error": bool,
    "content": List[Dict[str, Any]],
}, total=False)

# An OpenAI Chat Completions role "tool" message; content is the same text as Anthropic's
# text block. That API takes no images in a tool message: when the run has images, the
# text ends with images_not_shown, a line per image naming where the API serves it (an
# output's place in GET /v1/jobs/{id}, an artifact's route).
OpenAIToolMessage = TypedDict("OpenAIToolMessage", {
    "role": Literal["tool"],
    "tool_call_id": str,
    "content": str,
}, total=False)

# An OpenAI Responses API function_call_output input item: output is the text (the same as
# Anthropic's text block), then each image (display outputs' images, then image artifacts
# up to 5 MiB) as an input_image with a base64 data URL.
OpenAIResponsesFunctionCallOutput = TypedDict("OpenAIResponsesFunctionCallOutput", {
    "type": Literal["function_call_output"],
    "call_id": str,
    "output": List[Dict[str, Any]],
}, total=False)

# Accept a cached result no older than max_age_s seconds.
CacheMaxAge = TypedDict("CacheMaxAge", {
    "max_age_s": int,
}, total=False)

BudgetUse = TypedDict("BudgetUse", {
    "runs": int,
    "cpu_ms": int,
    "wall_ms": int,
    "artifact_bytes": int,
}, total=False)

# At least one max_* must be set.
BudgetRequest = TypedDict("BudgetRequest", {
    "max_runs": int,
    "max_cpu_ms": int,
    "max_wall_ms": int,
    "max_artifact_bytes": int,
    "expires_s": int,
}, total=False)

# A budget, what the runs that ended used and what the jobs accepted and not yet ended
# hold.
Budget = TypedDict("Budget", {
    "id": str,
    "max_runs": int,
    "max_cpu_ms": int,
    "max_wall_ms": int,
    "max_artifact_bytes": int,
    "used": "BudgetUse",
    "reserved": "BudgetUse",
    "created_at": str,
    "expires_at": str,
}, total=False)

# One entry of the caller's audit log. Code, inputs and outputs appear as SHA-256 sums
# only. A tenant's records are bounded per UTC day (key file: audit_records_per_day,
# default 100000; audit_bytes_per_day, default 64 MiB): past either, its further records
# that day are not kept, and one record of kind audit_bound says so.
AuditRecord = TypedDict("AuditRecord", {
    "seq": int,
    "time": str,
    "kind": Literal["submission", "result", "cancel", "budget_created", "budget_refusal", "replay", "egress", "audit_bound", "session_created", "session_call", "session_result", "session_ended", "session_paused", "session_resumed"],
    "key": str,
    "job_id": str,
    "session_id": str,
    "call": int,
    "runtime": str,
    "digest": str,
    "code_sha256": str,
    "inputs": Dict[str, str],
    "cache_hit": bool,
    "replay_of": str,
    "budget": str,
    "status": str,
    "exit_code": int,
    "outputs": Dict[str, str],
    "detail": str,
    "egress": "EgressRecord",
    "count": int,
}, total=False)

SessionSpec = TypedDict("SessionSpec", {
    "runtime": str,
    "limits": "Limits",
    "memory_mb": int,
    "idle_timeout_s": int,
    "max_lifetime_s": int,
    "files": List["File"],
    "restore": Literal["files", "replay"],
    "network": "Network",
    "metadata": "Metadata",
    "env": Dict[str, str],
}, total=False)

Session = TypedDict("Session", {
    "id": str,
    "status": Literal["starting", "ready", "moving", "paused", "ended"],
    "runtime": str,
    "image": Dict[str, Any],
    "created_at": str,
    "expires_at": str,
    "idle_expires_at": str,
    "incarnation": int,
    "calls": int,
    "memory_mb": int,
    "idle_timeout_s": int,
    "max_lifetime_s": int,
    "restore": Literal["files", "replay"],
    "network": "Network",
    "ended_reason": Literal["deleted", "idle_timeout", "max_lifetime", "unavailable"],
    "links": Dict[str, str],
    "metadata": "Metadata",
    "paused_at": str,
    "restored": Literal["memory", "files", "files+replay", "files+variables"],
}, total=False)

SessionCall = TypedDict("SessionCall", {
    "code": str,
    "stdin": str,
    "args": List[str],
    "env": Dict[str, str],
    "files": List["File"],
    "limits": "Limits",
    "budget": str,
}, total=False)

# One call of a session: everything a job's result has (Result), and where the call stands
# in its session.
CallResult = TypedDict("CallResult", {
    "id": str,
    "status": "TerminalStatus",
    "exit_code": int,
    "signal": str,
    "stdout": str,
    "stderr": str,
    "stdout_base64": str,
    "stderr_base64": str,
    "stdout_truncated": bool,
    "stderr_truncated": bool,
    "stdout_bytes": int,
    "stderr_bytes": int,
    "wall_ms": int,
    "cpu_ms": int,
    "memory_peak_bytes": int,
    "image": Dict[str, Any],
    "error": "Failure",
    "limits": "Limits",
    "artifacts": List["Artifact"],
    "artifacts_skipped": List["SkippedArtifact"],
    "artifacts_skipped_count": int,
    "redactions": Dict[str, int],
    "egress": "Egress",
    "replay_of": str,
    "replay": Dict[str, Any],
    "queue_ms": int,
    "attempt": int,
    "worker": str,
    "cache_hit": bool,
    "created_at": str,
    "started_at": str,
    "finished_at": str,
    "trace_id": str,
    "links": "Links",
    "outputs": List["DisplayOutput"],
    "outputs_truncated": bool,
    "outputs_dropped": int,
    "seq": int,
    "incarnation": int,
    "state_restored": bool,
    "session_note": str,
    "file": "SessionFileOutcome",
    "command": "CommandState",
    "commands": List["CommandState"],
}, total=False)

# The program's uncaught exception or syntax error as its launcher reported it (Python and
# Node), on runtime_error and syntax_error failures: the program's own account, attached
# only when the run ended as the launcher ends an uncaught exception (exit status 1, or
# 130 for Python's KeyboardInterrupt; no signal; one exception record), its frames only
# those of the program's files under /work. A record the ending does not bear out is not
# attached and counts in outputs_dropped.
Exception = TypedDict("Exception", {
    "type": str,
    "message": str,
    "line": int,
    "column": int,
    "source_line": str,
    "frames": List["Frame"],
}, total=False)

Frame = TypedDict("Frame", {
    "file": str,
    "line": int,
    "function": str,
}, total=False)

# A display output (a Jupyter MIME bundle): the value of the program's last expression
# (execute_result), a display(obj) call or a matplotlib figure (display_data). Outputs
# come over a channel of the launcher's own, never from stdout.
DisplayOutput = TypedDict("DisplayOutput", {
    "type": Literal["execute_result", "display_data"],
    "data": Dict[str, Any],
    "artifacts": Dict[str, str],
    "flattened": List[str],
}, total=False)

# An output event: one display output and its index in Result.outputs. Values other than
# text/plain are left out (partial: true) when the output is over 512 KiB; the result
# event carries it whole.
DisplayEvent = TypedDict("DisplayEvent", {
    "index": int,
    "type": Literal["execute_result", "display_data"],
    "data": Dict[str, Any],
    "artifacts": Dict[str, str],
    "partial": bool,
    "flattened": List[str],
}, total=False)

# A job's way out to named hosts, through an egress proxy its worker runs: the job's own
# network stays loopback-only, names are resolved by the proxy, private and metadata
# addresses are refused after resolution, and a TLS tunnel's SNI must name the host asked
# for. Every connection is recorded in the result's egress and the tenant's audit log
# (kind egress). Absent, or an empty allow: no network (the default). See docs/egress.md.
Network = TypedDict("Network", {
    "allow": List[str],
}, total=False)

# One connection a job asked its egress proxy for, allowed or refused.
EgressRecord = TypedDict("EgressRecord", {
    "time": str,
    "method": str,
    "host": str,
    "port": int,
    "addr": str,
    "allowed": bool,
    "reason": str,
    "bytes_up": int,
    "bytes_down": int,
    "duration_ms": int,
}, total=False)

# What a job with a network did through its egress proxy (absent for a job without one).
Egress = TypedDict("Egress", {
    "connections": int,
    "refused": int,
    "bytes_up": int,
    "bytes_down": int,
    "records": List["EgressRecord"],
    "records_dropped": int,
}, total=False)

# A call accepted that has not ended when the wait passed (202): where it stands and where
# to read it. It holds nothing of a result: no id, incarnation or state_restored, which
# only a call that ran can tell. Tell it from a CallResult by pending.
CallPending = TypedDict("CallPending", {
    "seq": int,
    "status": Literal["queued", "running"],
    "pending": Literal[True],
    "links": Dict[str, Any],
}, total=False)

# The caller's own labels on a job or a session (a platform's ids, a team, an experiment):
# at most 16 keys of 1 to 64 of A-Z a-z 0-9 _ . : -, each value a string of at most 256
# bytes. Returned as sent and filterable in listings (tag=KEY=VALUE). The caller's own
# input: not redacted (unlike a program's output), not part of the cache key; an identical
# job in flight is shared only with a submission of the same metadata.
Metadata = Dict[str, str]

# A job in a listing: what it is and how it ended, without its output; GET links.self for
# the whole job.
JobSummary = TypedDict("JobSummary", {
    "id": str,
    "status": "Status",
    "runtime": str,
    "created_at": str,
    "started_at": str,
    "finished_at": str,
    "exit_code": int,
    "error": "Failure",
    "cache_hit": bool,
    "metadata": "Metadata",
    "replay_of": str,
    "links": "Links",
}, total=False)

# A page of the caller's jobs, newest first.
JobPage = TypedDict("JobPage", {
    "jobs": List["JobSummary"],
    "next_cursor": str,
}, total=False)

# Where the delivery of the job's result to its callback_url stands.
CallbackState = TypedDict("CallbackState", {
    "url": str,
    "state": Literal["pending", "delivered", "failed"],
    "attempts": int,
    "last_status": int,
    "last_error": str,
    "last_attempt_at": str,
    "next_attempt_at": str,
    "delivered_at": str,
}, total=False)

# An entry of a session's /work as its last call (or file operation) left it: a file, a
# directory or a symbolic link (links are listed, never followed, and not brought back
# when the session moves to another worker).
SessionFileInfo = TypedDict("SessionFileInfo", {
    "path": str,
    "name": str,
    "type": Literal["file", "dir", "symlink"],
    "size": int,
    "mode": str,
    "mtime": str,
    "sha256": str,
}, total=False)

# A directory of a session's /work: its entries (every entry below it with
# recursive=true), by path, at most `limit` a page.
SessionFileList = TypedDict("SessionFileList", {
    "path": str,
    "entries": List["SessionFileInfo"],
    "next_cursor": str,
}, total=False)

# A file operation sent to POST /v1/sessions/{id}/files: mkdir (a directory and its
# parents) or move (rename path to `to`, to's parents made). Uploads are PUT and removals
# DELETE on /v1/sessions/{id}/files/{path}.
SessionFileOp = TypedDict("SessionFileOp", {
    "op": Literal["mkdir", "move"],
    "path": str,
    "to": str,
    "overwrite": bool,
}, total=False)

# Why a file operation was not done; its own answer was the problem this maps to
# (not_found 404, the others 409 file-conflict).
SessionFileError = TypedDict("SessionFileError", {
    "code": Literal["not_found", "exists", "not_a_directory", "is_a_directory", "not_empty", "symlink", "move_into_self", "too_large"],
    "field": Literal["path", "to"],
    "detail": str,
    "limit": int,
}, total=False)

# What a file operation (a call of the session made by the files routes) did.
SessionFileOutcome = TypedDict("SessionFileOutcome", {
    "op": Literal["put", "remove", "mkdir", "move"],
    "path": str,
    "to": str,
    "entry": "SessionFileInfo",
    "created": bool,
    "error": "SessionFileError",
}, total=False)

# A shell command line to run in a session (POST /v1/sessions/{id}/commands).
CommandRequest = TypedDict("CommandRequest", {
    "cmd": str,
    "timeout_s": int,
    "background": bool,
    "env": Dict[str, str],
    "stdin": bool,
}, total=False)

# Where a command stands once its call ended (in a list of the session's commands, where
# each stands).
CommandState = TypedDict("CommandState", {
    "id": str,
    "background": bool,
    "running": bool,
    "exit_code": int,
    "killed": bool,
    "missing": bool,
    "cmd": str,
    "stdin": bool,
    "stdin_closed": bool,
}, total=False)

# A write to a background command's stdin (POST /v1/sessions/{id}/commands/{cid}/stdin):
# data, a close, or both.
StdinRequest = TypedDict("StdinRequest", {
    "data": str,
    "close": bool,
}, total=False)

# The keys each schema's objects always hold.
REQUIRED = {
    "Spec": ("code",),
    "File": ("name", "content"),
    "Policy": ("default", "max"),
    "RuntimeInfo": ("name", "image", "digest", "limits"),
    "Links": ("self", "wait"),
    "Accepted": ("id", "status", "links"),
    "Failure": ("category", "message", "retryable"),
    "Result": ("id", "status", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "stdout_bytes", "stderr_bytes", "wall_ms", "cpu_ms", "memory_peak_bytes", "image", "cache_hit"),
    "BatchItem": ("index", "status"),
    "ListError": ("id", "error"),
    "Artifact": ("name", "size", "sha256", "content_type"),
    "SkippedArtifact": ("name", "reason"),
    "StatusEvent": ("status",),
    "SkippedEvent": ("stream", "bytes"),
    "Problem": ("type", "title", "status"),
    "AnthropicTool": ("name", "description", "input_schema"),
    "OpenAITool": ("type", "function"),
    "OpenAIResponsesTool": ("type", "name", "description", "parameters", "strict"),
    "ToolList": ("format", "tools"),
    "AnthropicToolUse": ("type", "id", "name"),
    "OpenAIToolCall": ("id", "type", "function"),
    "OpenAIResponsesFunctionCall": ("type", "call_id", "name"),
    "ToolInput": ("code",),
    "AnthropicToolResult": ("type", "tool_use_id", "content", "is_error"),
    "OpenAIToolMessage": ("role", "tool_call_id", "content"),
    "OpenAIResponsesFunctionCallOutput": ("type", "call_id", "output"),
    "CacheMaxAge": ("max_age_s",),
    "BudgetUse": ("runs", "cpu_ms", "wall_ms", "artifact_bytes"),
    "Budget": ("id", "used", "reserved", "created_at", "expires_at"),
    "AuditRecord": ("seq", "time", "kind"),
    "Session": ("id", "status", "runtime", "image", "created_at", "expires_at", "incarnation"),
    "SessionCall": ("code",),
    "CallResult": ("id", "status", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "stdout_bytes", "stderr_bytes", "wall_ms", "cpu_ms", "memory_peak_bytes", "image", "cache_hit"),
    "Exception": ("type", "message"),
    "Frame": ("file", "line", "function"),
    "DisplayOutput": ("type", "data"),
    "DisplayEvent": ("index", "type", "data"),
    "EgressRecord": ("time", "method", "host", "port", "allowed", "bytes_up", "bytes_down", "duration_ms"),
    "Egress": ("connections", "refused", "bytes_up", "bytes_down"),
    "CallPending": ("seq", "status", "pending", "links"),
    "JobSummary": ("id", "status", "runtime", "created_at", "cache_hit", "links"),
    "JobPage": ("jobs",),
    "CallbackState": ("url", "state", "attempts"),
    "SessionFileInfo": ("path", "name", "type", "size", "mode", "mtime"),
    "SessionFileList": ("path", "entries"),
    "SessionFileOp": ("op", "path"),
    "SessionFileError": ("code", "detail"),
    "SessionFileOutcome": ("op", "path"),
    "CommandRequest": ("cmd",),
    "CommandState": ("running",),
}
