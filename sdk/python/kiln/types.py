"""Typed views of the API's JSON: the job spec a client sends and the job it reads back."""
from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ._schema import TERMINAL_STATUSES as _TERMINAL

TERMINAL_STATUSES = frozenset(_TERMINAL)

# Error categories a changed program can get past (agents: fix the code and retry).
FIXABLE_CATEGORIES = frozenset({"syntax_error", "runtime_error", "timeout", "memory_limit", "output_limit"})


@dataclass
class Limits:
    """Per-job limits; None takes the server default."""
    timeout_ms: Optional[int] = None
    memory_mb: Optional[int] = None
    cpu_ms: Optional[int] = None
    pids: Optional[int] = None
    output_bytes: Optional[int] = None
    disk_mb: Optional[int] = None

    def to_dict(self) -> Dict[str, int]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class File:
    """An input file placed in the job's working directory. ``content`` bytes are sent as base64."""
    name: str
    content: Union[str, bytes]

    def to_dict(self) -> Dict[str, str]:
        if isinstance(self.content, (bytes, bytearray, memoryview)):
            return {"name": self.name, "content": base64.b64encode(bytes(self.content)).decode("ascii"),
                    "encoding": "base64"}
        return {"name": self.name, "content": self.content}


FilesArg = Union[None, Mapping[str, Union[str, bytes]], Sequence[Union[File, Mapping[str, Any]]]]


@dataclass
class Spec:
    """One job as submitted. ``files`` maps names to str or bytes, or lists File."""
    code: str
    runtime: Optional[str] = None
    stdin: Optional[str] = None
    args: Optional[List[str]] = None
    env: Optional[Dict[str, str]] = None
    files: FilesArg = None
    limits: Union[None, Limits, Mapping[str, int]] = None
    cache: Optional[bool] = None
    budget: Optional[str] = None  # a budget id (Client.create_budget) the run is charged to
    # Hosts the job may reach through its egress proxy ("api.example.org", "*.data.gov",
    # "api.example.org:8443"), each within the API key's egress allowance; None or []:
    # no network. Sent as {"network": {"allow": [...]}}. A job with a network uses the
    # result cache only when ``cache`` is set.
    network: Optional[Sequence[str]] = None
    # The job's labels (its metadata): at most 16 KEY: VALUE strings, returned with it
    # and filterable in Client.list_jobs(tags=...). Not redacted, not part of the cache key.
    metadata: Optional[Mapping[str, str]] = None

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"code": self.code}
        if self.runtime:
            d["runtime"] = self.runtime
        if self.stdin is not None:
            d["stdin"] = self.stdin
        if self.args:
            d["args"] = list(self.args)
        if self.env:
            d["env"] = dict(self.env)
        files = _files(self.files)
        if files:
            d["files"] = files
        if isinstance(self.limits, Limits):
            lim = self.limits.to_dict()
        else:
            lim = {k: v for k, v in dict(self.limits or {}).items() if v is not None}
        if lim:
            d["limits"] = lim
        if self.cache is not None:
            d["cache"] = self.cache
        if self.budget:
            d["budget"] = self.budget
        if self.network:
            if isinstance(self.network, str):
                raise TypeError("network is a list of hosts, such as [\"api.example.org\"]")
            d["network"] = {"allow": list(self.network)}
        if self.metadata:
            d["metadata"] = dict(self.metadata)
        return d


def _files(files: FilesArg) -> List[Dict[str, str]]:
    if not files:
        return []
    if isinstance(files, Mapping):
        return [File(name, content).to_dict() for name, content in files.items()]
    out = []
    for f in files:
        out.append(f.to_dict() if isinstance(f, File) else dict(f))
    return out


@dataclass
class Image:
    name: str = ""
    digest: str = ""


@dataclass
class Failure:
    """Why a job failed. ``retryable``: the same job may succeed unchanged (a platform fault)."""
    category: str = ""
    message: str = ""
    retryable: bool = False
    # The program's exception or syntax error as its launcher saw it (Python, Node):
    # {type, message, line, column, source_line, frames: [{file, line, function}]}.
    exception: Optional[Dict[str, Any]] = None

    @property
    def fixable(self) -> bool:
        """True when changing the code can help (syntax or runtime error, a limit hit)."""
        return self.category in FIXABLE_CATEGORIES


@dataclass
class Artifact:
    """A file the job left in its output directory; download it with Client.artifact()."""
    name: str = ""
    size: int = 0
    sha256: str = ""
    content_type: str = ""


def _time(v: Any) -> Optional[str]:
    return v if isinstance(v, str) and v else None


@dataclass
class Result:
    """A job as the API shows it.

    A finished job (``done`` is True) carries its whole result; a queued or running one
    only ``id``, ``status``, timestamps, ``attempt``, ``worker`` and ``trace_id``.
    ``accepted`` is True when a submission was answered 202 (not finished yet).
    ``raw`` is the JSON object as received, for fields newer than this client.
    """
    id: str = ""
    status: str = ""
    exit_code: Optional[int] = None
    signal: str = ""
    stdout: str = ""
    stderr: str = ""
    stdout_base64: str = ""
    stderr_base64: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    wall_ms: int = 0
    cpu_ms: int = 0
    memory_peak_bytes: int = 0
    queue_ms: int = 0
    attempt: int = 0
    worker: str = ""
    cache_hit: bool = False
    image: Optional[Image] = None
    error: Optional[Failure] = None
    limits: Optional[Dict[str, int]] = None
    artifacts: List[Artifact] = field(default_factory=list)
    # Display outputs (last expression, display(), figures): MIME bundles
    # {"type", "data": {mime: value}, "artifacts": {mime: name}, "flattened": [mime]}, in
    # order. A JSON value nested deeper than the server's bound (100) is given as its JSON
    # text, a string, and its MIME type listed in "flattened".
    outputs: List[Dict[str, Any]] = field(default_factory=list)
    outputs_truncated: bool = False
    outputs_dropped: int = 0
    created_at: Optional[str] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    trace_id: str = ""
    cancel_requested: bool = False
    # A job with a network: what it did through its egress proxy
    # {connections, refused, bytes_up, bytes_down, records: [{host, port, allowed, reason, ...}]}.
    egress: Optional[Dict[str, Any]] = None
    # The job's labels, as its submission sent them.
    metadata: Dict[str, str] = field(default_factory=dict)
    # The job this one replays (Client.replay), and how the two outcomes compare.
    replay_of: str = ""
    replay: Optional[Dict[str, Any]] = None
    accepted: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def done(self) -> bool:
        """True once the job is in a terminal status."""
        return self.status in TERMINAL_STATUSES

    @property
    def ok(self) -> bool:
        """True when the job succeeded (exit code 0)."""
        return self.status == "succeeded"

    @property
    def stdout_bytes_exact(self) -> bytes:
        """stdout as the program wrote it (base64 form when it was not valid UTF-8)."""
        return base64.b64decode(self.stdout_base64) if self.stdout_base64 else self.stdout.encode()

    @property
    def stderr_bytes_exact(self) -> bytes:
        """stderr as the program wrote it."""
        return base64.b64decode(self.stderr_base64) if self.stderr_base64 else self.stderr.encode()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], accepted: bool = False) -> "Result":
        img = d.get("image")
        err = d.get("error")
        arts = d.get("artifacts") or []
        return cls(
            id=str(d.get("id") or ""),
            status=str(d.get("status") or ""),
            exit_code=d.get("exit_code"),
            signal=d.get("signal") or "",
            stdout=d.get("stdout") or "",
            stderr=d.get("stderr") or "",
            stdout_base64=d.get("stdout_base64") or "",
            stderr_base64=d.get("stderr_base64") or "",
            stdout_truncated=bool(d.get("stdout_truncated")),
            stderr_truncated=bool(d.get("stderr_truncated")),
            stdout_bytes=int(d.get("stdout_bytes") or 0),
            stderr_bytes=int(d.get("stderr_bytes") or 0),
            wall_ms=int(d.get("wall_ms") or 0),
            cpu_ms=int(d.get("cpu_ms") or 0),
            memory_peak_bytes=int(d.get("memory_peak_bytes") or 0),
            queue_ms=int(d.get("queue_ms") or 0),
            attempt=int(d.get("attempt") or 0),
            worker=d.get("worker") or "",
            cache_hit=bool(d.get("cache_hit")),
            image=Image(name=img.get("name", ""), digest=img.get("digest", "")) if isinstance(img, dict) else None,
            error=Failure(category=err.get("category", ""), message=err.get("message", ""),
                          retryable=bool(err.get("retryable")),
                          exception=err.get("exception") if isinstance(err.get("exception"), dict) else None)
            if isinstance(err, dict) else None,
            limits=d.get("limits") if isinstance(d.get("limits"), dict) else None,
            artifacts=[artifact_from_dict(a) for a in arts if isinstance(a, dict)],
            outputs=[o for o in d.get("outputs") or [] if isinstance(o, dict)],
            outputs_truncated=bool(d.get("outputs_truncated")),
            outputs_dropped=int(d.get("outputs_dropped") or 0),
            created_at=_time(d.get("created_at")),
            started_at=_time(d.get("started_at")),
            finished_at=_time(d.get("finished_at")),
            trace_id=d.get("trace_id") or "",
            cancel_requested=bool(d.get("cancel_requested")),
            egress=d.get("egress") if isinstance(d.get("egress"), dict) else None,
            metadata=dict(d.get("metadata") or {}),
            replay_of=d.get("replay_of") or "",
            replay=d.get("replay") if isinstance(d.get("replay"), dict) else None,
            accepted=accepted,
            raw=dict(d),
        )


@dataclass
class JobSummary:
    """A job in a listing (Client.list_jobs): what it is and how it ended, without its
    output; Client.get(id) reads the whole job."""
    id: str = ""
    status: str = ""
    runtime: str = ""
    created_at: Optional[str] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    exit_code: Optional[int] = None
    error: Optional[Failure] = None
    cache_hit: bool = False
    metadata: Dict[str, str] = field(default_factory=dict)
    replay_of: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "JobSummary":
        err = d.get("error")
        return cls(id=str(d.get("id") or ""), status=str(d.get("status") or ""), runtime=str(d.get("runtime") or ""),
                   created_at=_time(d.get("created_at")), started_at=_time(d.get("started_at")),
                   finished_at=_time(d.get("finished_at")), exit_code=d.get("exit_code"),
                   error=Failure(category=err.get("category", ""), message=err.get("message", ""),
                                 retryable=bool(err.get("retryable"))) if isinstance(err, dict) else None,
                   cache_hit=bool(d.get("cache_hit")), metadata=dict(d.get("metadata") or {}),
                   replay_of=d.get("replay_of") or "", raw=dict(d))


@dataclass
class JobPage:
    """A page of jobs, newest first; ``next_cursor`` reads the next (None: no more)."""
    jobs: List[JobSummary] = field(default_factory=list)
    next_cursor: Optional[str] = None


def artifact_from_dict(a: Mapping[str, Any]) -> Artifact:
    size = a.get("size", a.get("bytes", 0))
    return Artifact(name=str(a.get("name") or ""), size=int(size or 0), sha256=str(a.get("sha256") or ""),
                    content_type=str(a.get("content_type") or ""))


@dataclass
class BatchItem:
    """One job of a batch, in request order: ``job`` when accepted or answered, ``error`` when refused."""
    index: int
    status: int
    job: Optional[Result] = None
    error: Optional[Exception] = None


@dataclass
class Event:
    """One Server-Sent Event of a job's live stream.

    ``type`` is ``status``, ``stdout``, ``stderr``, ``output_skipped``, ``output``,
    ``artifacts`` or ``result``; ``data`` the decoded JSON. ``text`` is the output chunk of
    stdout/stderr events; ``skipped`` the bytes an output_skipped event says the live view
    left out at that point (the stored result has them); ``result`` the final Result of a
    result event; ``artifacts`` the list of an artifacts event.
    """
    type: str
    data: Any
    id: Optional[str] = None

    @property
    def text(self) -> str:
        if isinstance(self.data, dict):
            if "data" in self.data and isinstance(self.data["data"], str):
                return self.data["data"]
            if "data_base64" in self.data:
                return base64.b64decode(self.data["data_base64"]).decode("utf-8", "replace")
        return ""

    @property
    def raw_bytes(self) -> bytes:
        """The output chunk's exact bytes (from data_base64 when given)."""
        if isinstance(self.data, dict) and self.data.get("data_base64"):
            return base64.b64decode(self.data["data_base64"])
        return self.text.encode()

    @property
    def status(self) -> str:
        return str(self.data.get("status", "")) if isinstance(self.data, dict) else ""

    @property
    def skipped(self) -> int:
        """Bytes of ``data["stream"]`` left out of the live view (output_skipped events; else 0)."""
        if self.type == "output_skipped" and isinstance(self.data, dict):
            return int(self.data.get("bytes") or 0)
        return 0

    @property
    def result(self) -> Optional[Result]:
        return Result.from_dict(self.data) if self.type == "result" and isinstance(self.data, dict) else None

    @property
    def artifacts(self) -> List[Artifact]:
        items = self.data
        if isinstance(items, dict):
            items = items.get("artifacts", [])
        return [artifact_from_dict(a) for a in (items or []) if isinstance(a, dict)]
