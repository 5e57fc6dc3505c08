"""Tool-call helpers for model vendors' formats (Anthropic Messages, OpenAI Chat Completions
and Responses): the tool definition for run_python, a tool call turned into a job, and a
Result turned into the vendor's tool-result block.

The model decides what to do next from the result's ``error.category`` and the
``fix_code_and_retry`` / ``retryable`` hints, never from parsing stderr.
"""
from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from .types import FIXABLE_CATEGORIES, Result, Spec

ANTHROPIC = "anthropic"
OPENAI = "openai"                      # Chat Completions: tools=[{"type": "function", ...}]
OPENAI_RESPONSES = "openai-responses"  # Responses API: tools=[{"type": "function", "name": ...}]
FORMATS = (ANTHROPIC, OPENAI, OPENAI_RESPONSES)

MAX_TIMEOUT_S = 300


def input_schema(runtime: str = "python") -> Dict[str, Any]:
    """The JSON Schema of the tool's arguments."""
    return {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": f"The {runtime} program to run. Print what you need to see."},
            "stdin": {"type": "string", "description": "Text fed to the program's standard input."},
            "files": {
                "type": "array",
                "description": "Input files placed in the working directory before the program starts.",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "Relative path, e.g. data/in.csv"},
                        "content": {"type": "string", "description": "File content: UTF-8 text, or base64 with encoding=base64"},
                        "encoding": {"type": "string", "enum": ["utf-8", "base64"]},
                    },
                    "required": ["name", "content"],
                },
            },
            "timeout_s": {"type": "number", "minimum": 1, "maximum": MAX_TIMEOUT_S,
                          "description": "Wall-clock limit in seconds (default 10)."},
        },
        "required": ["code"],
    }


def _description(runtime: str) -> str:
    return (f"Run a {runtime} program in an isolated sandbox (no network, read-only system, "
            "fresh for every call) and get its stdout, stderr, exit code and wall time. "
            "Files the program writes to the directory in $KILN_OUTPUT_DIR come back as artifacts. "
            "On failure the result gives an error category (syntax_error, runtime_error, timeout, "
            "memory_limit, output_limit, ...) and whether fixing the code and retrying can help.")


def tool_definition(format: str = ANTHROPIC, *, runtime: str = "python", name: Optional[str] = None) -> Dict[str, Any]:
    """The tool definition of ``run_<runtime>`` in the vendor's tool schema."""
    name = name or f"run_{runtime}"
    desc, schema = _description(runtime), input_schema(runtime)
    if format == ANTHROPIC:
        return {"name": name, "description": desc, "input_schema": schema}
    if format == OPENAI:
        return {"type": "function", "function": {"name": name, "description": desc, "parameters": schema}}
    if format == OPENAI_RESPONSES:
        # strict defaults to true in the Responses API and would want every input required.
        return {"type": "function", "name": name, "description": desc, "parameters": schema, "strict": False}
    raise ValueError(f"unknown tool format {format!r}: use one of {', '.join(FORMATS)}")


class ToolCallError(ValueError):
    """The tool call cannot be turned into a job; ``call_id`` and ``format`` say how to answer it."""

    def __init__(self, message: str, call_id: str, format: str) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.format = format


@dataclass
class ToolCall:
    """A parsed tool call: who to answer (call_id, format) and the job to run."""
    call_id: str
    name: str
    format: str
    arguments: Dict[str, Any]
    spec: Spec


def parse_tool_call(call: Mapping[str, Any], *, runtime: Optional[str] = None) -> ToolCall:
    """Turn an Anthropic ``tool_use`` block or an OpenAI tool call into a job Spec.

    The runtime comes from the tool name (``run_python`` → python) unless given.
    Raises ToolCallError for a call that is not one of those formats or whose
    arguments are not usable.
    """
    if call.get("type") == "tool_use":
        fmt, call_id, name, args = ANTHROPIC, str(call.get("id", "")), str(call.get("name", "")), call.get("input")
    elif call.get("type") == "function_call":
        fmt, call_id, name, args = OPENAI_RESPONSES, str(call.get("call_id", "")), str(call.get("name", "")), call.get("arguments")
    elif isinstance(call.get("function"), Mapping):
        fn = call["function"]
        fmt, call_id, name, args = OPENAI, str(call.get("id", "")), str(fn.get("name", "")), fn.get("arguments")
    else:
        raise ToolCallError("not a tool call: expected an Anthropic tool_use block or an OpenAI tool call", "", ANTHROPIC)
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as e:
            raise ToolCallError(f"the arguments of {name} are not valid JSON: {e}", call_id, fmt) from None
    if not isinstance(args, Mapping):
        raise ToolCallError(f"the arguments of {name} must be a JSON object", call_id, fmt)
    code = args.get("code")
    if not isinstance(code, str) or not code.strip():
        raise ToolCallError(f"{name} needs a non-empty string argument \"code\"", call_id, fmt)
    rt = runtime or (name[len("run_"):] if name.startswith("run_") else None)
    limits: Dict[str, int] = {}
    t = args.get("timeout_s")
    if t is not None:
        if not isinstance(t, (int, float)) or isinstance(t, bool) or t <= 0:
            raise ToolCallError("timeout_s must be a positive number of seconds", call_id, fmt)
        limits["timeout_ms"] = int(min(t, MAX_TIMEOUT_S) * 1000)
    files = []
    for f in args.get("files") or []:
        if not isinstance(f, Mapping) or not isinstance(f.get("name"), str) or not isinstance(f.get("content"), str):
            raise ToolCallError("each file needs string \"name\" and \"content\"", call_id, fmt)
        item = {"name": f["name"], "content": f["content"]}
        if f.get("encoding") == "base64":
            item["encoding"] = "base64"
        files.append(item)
    stdin = args.get("stdin")
    spec = Spec(code=code, runtime=rt, stdin=stdin if isinstance(stdin, str) else None,
                files=files or None, limits=limits or None)
    return ToolCall(call_id=call_id, name=name, format=fmt, arguments=dict(args), spec=spec)


def server_call(call: Mapping[str, Any], *, runtime: Optional[str] = None) -> Tuple[Dict[str, Any], str, str]:
    """The body ``POST /v1/tool-calls`` takes for a model's tool call (the call itself, in
    any of the three formats), with the call's format and id; ``runtime`` renames the
    tool (``python-slim`` → ``run_python_slim``)."""
    if not isinstance(call, Mapping):
        raise ToolCallError("not a tool call: expected an Anthropic tool_use block or an OpenAI tool call", "", ANTHROPIC)
    name_for = (lambda n: "run_" + runtime.replace("-", "_")) if runtime else (lambda n: n)
    body = dict(call)
    if call.get("type") == "function_call":
        body["name"] = name_for(str(call.get("name", "")))
        return body, OPENAI_RESPONSES, str(call.get("call_id", ""))
    if call.get("type") == "tool_use":
        body["name"] = name_for(str(call.get("name", "")))
        return body, ANTHROPIC, str(call.get("id", ""))
    if isinstance(call.get("function"), Mapping):
        fn = dict(call["function"])
        fn["name"] = name_for(str(fn.get("name", "")))
        body["function"] = fn
        return body, OPENAI, str(call.get("id", ""))
    raise ToolCallError("not a tool call: expected an Anthropic tool_use block or an OpenAI tool call", "", ANTHROPIC)


def result_payload(res: Result, base_url: str = "") -> Dict[str, Any]:
    """The JSON the model reads: output, exit code, wall time, and for a failure its
    category with ``fix_code_and_retry`` (changing the code can help) and ``retryable``
    (the same code may succeed on a second try: a platform fault)."""
    out: Dict[str, Any] = {
        "status": res.status,
        "exit_code": res.exit_code,
        "stdout": res.stdout,
        "stderr": res.stderr,
        "wall_ms": res.wall_ms,
    }
    if res.stdout_truncated or res.stderr_truncated:
        out["truncated"] = {"stdout": res.stdout_truncated, "stderr": res.stderr_truncated}
    if res.error is not None:
        out["error"] = {
            "category": res.error.category,
            "message": res.error.message,
            "retryable": res.error.retryable,
            "fix_code_and_retry": res.error.category in FIXABLE_CATEGORIES,
        }
    if res.artifacts:
        arts = []
        for a in res.artifacts:
            item: Dict[str, Any] = {"name": a.name, "size": a.size, "content_type": a.content_type, "sha256": a.sha256}
            if base_url and res.id:
                item["url"] = (f"{base_url.rstrip('/')}/v1/jobs/{urllib.parse.quote(res.id, safe='')}"
                               f"/artifacts/{urllib.parse.quote(a.name, safe='')}")
            arts.append(item)
        out["artifacts"] = arts
    return out


def _block(text: str, is_error: bool, call_id: str, format: str) -> Dict[str, Any]:
    if format == ANTHROPIC:
        return {"type": "tool_result", "tool_use_id": call_id, "content": [{"type": "text", "text": text}],
                "is_error": is_error}
    if format == OPENAI:
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    if format == OPENAI_RESPONSES:
        return {"type": "function_call_output", "call_id": call_id, "output": text}
    raise ValueError(f"unknown tool format {format!r}: use one of {', '.join(FORMATS)}")


def tool_result(res: Result, call_id: str, format: str = ANTHROPIC, *, base_url: str = "") -> Dict[str, Any]:
    """The vendor's tool-result block for a finished job. ``is_error`` (Anthropic) is
    set unless the job succeeded; OpenAI formats carry it in the JSON text."""
    payload = result_payload(res, base_url)
    is_error = not res.ok
    if format != ANTHROPIC:
        payload["is_error"] = is_error
    return _block(json.dumps(payload, ensure_ascii=False), is_error, call_id, format)


def error_result(message: str, call_id: str, format: str = ANTHROPIC) -> Dict[str, Any]:
    """A tool-result block for a call that could not run (bad arguments)."""
    payload: Dict[str, Any] = {"status": "invalid_request",
                               "error": {"category": "invalid_request", "message": message, "retryable": False,
                                         "fix_code_and_retry": True}}
    if format != ANTHROPIC:
        payload["is_error"] = True
    return _block(json.dumps(payload, ensure_ascii=False), True, call_id, format)
