"""Sessions: a sandbox whose interpreter and /work are kept between calls.

    with client.session() as s:
        s.run("import pandas as pd; df = pd.read_csv('data.csv')")
        print(s.run("print(df.describe())").stdout)

Variables, imports, the current directory and files persist from call to call.
Files: ``write_file``/``upload``, ``read_file``/``download``, ``list_files``, ``stat``,
``remove``, ``mkdir`` and ``move`` work on the session's /work between calls.
A call's result is a ``Result`` plus ``seq``, ``incarnation`` and
``state_restored`` (False when the call found a fresh interpreter: the session's
memory cap, or its worker lost; ``session_note`` says what to do).
"""
from __future__ import annotations

import os
import posixpath
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, Union

from .types import Result

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client


def _session_path(session_id: str) -> str:
    return "/v1/sessions/" + urllib.parse.quote(session_id, safe="")


def _quote_segment(p: str) -> str:
    """A path element as it goes in a URL: escaped, and a . or .. element sent as such (its
    dots escaped), so no URL resolution turns a path under /work into another URL; the
    API refuses it, naming the path."""
    if p in (".", ".."):
        return p.replace(".", "%2E")
    return urllib.parse.quote(p, safe="")


@dataclass
class CallResult(Result):
    """One call of a session: a job's Result plus where it stands in its session."""
    seq: int = 0
    incarnation: int = 0
    state_restored: bool = True
    session_note: str = ""
    # A command's call: where the command stands ({"id"?, "background"?, "running",
    # "exit_code"?, "killed"?, "stdin"?}); None for a call of code.
    command: Optional[Dict[str, Any]] = None
    # A list of the session's background commands (list_commands): each one's state
    # ({"id", "cmd", "background", "running", "exit_code"?, "killed"?, "stdin"?}),
    # oldest first; [] for any other call.
    commands: List[Dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_call(cls, d: Mapping[str, Any]) -> "CallResult":
        base = Result.from_dict(d)
        out = cls(**{f: getattr(base, f) for f in base.__dataclass_fields__})
        out.seq = int(d.get("seq") or 0)
        out.incarnation = int(d.get("incarnation") or 0)
        out.state_restored = bool(d.get("state_restored"))
        out.session_note = d.get("session_note") or ""
        out.command = dict(d["command"]) if isinstance(d.get("command"), Mapping) else None
        out.commands = [dict(c) for c in d.get("commands") or () if isinstance(c, Mapping)]
        return out


@dataclass
class FileInfo:
    """An entry of a session's /work: a file, a directory or a symbolic link."""
    path: str
    name: str = ""
    type: str = "file"  # file | dir | symlink
    size: int = 0
    mode: str = ""      # permission bits in octal, "0644"
    mtime: str = ""     # RFC 3339
    sha256: str = ""    # a file's content hash

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FileInfo":
        return cls(path=str(d.get("path") or ""), name=str(d.get("name") or ""), type=str(d.get("type") or "file"),
                   size=int(d.get("size") or 0), mode=str(d.get("mode") or ""), mtime=str(d.get("mtime") or ""),
                   sha256=str(d.get("sha256") or ""))

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"


@dataclass
class Session:
    """A session of the API. Use ``run(code)``; ``close()`` (or a ``with`` block) ends it."""
    id: str
    status: str = ""
    runtime: str = ""
    incarnation: int = 0
    expires_at: Optional[str] = None
    metadata: Dict[str, str] = field(default_factory=dict)
    paused_at: Optional[str] = None  # when it last paused
    restored: Optional[str] = None   # what its last resume brought back: memory | files | files+replay | files+variables
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Optional["Client"] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], client: "Client") -> "Session":
        return cls(id=str(d.get("id") or ""), status=str(d.get("status") or ""), runtime=str(d.get("runtime") or ""),
                   incarnation=int(d.get("incarnation") or 0), expires_at=d.get("expires_at"),
                   metadata=dict(d.get("metadata") or {}), paused_at=d.get("paused_at"), restored=d.get("restored"),
                   raw=dict(d), _client=client)

    def _update(self, d: Optional[Mapping[str, Any]]) -> "Session":
        """Take the session as the API answered it."""
        if d and d.get("id"):
            fresh = Session.from_dict(d, self._client)  # type: ignore[arg-type]
            for f in ("status", "runtime", "incarnation", "expires_at", "metadata", "paused_at", "restored", "raw"):
                setattr(self, f, getattr(fresh, f))
        return self

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(self, code: str, *, timeout: Optional[float] = None, **call: Any) -> CallResult:
        """Run ``code`` as the session's next call and wait for its result.

        Extra call fields go as keyword arguments (stdin, args, env, files, limits,
        budget: a budget id the call is charged to).
        Every try carries one Idempotency-Key, so a retry never runs the call twice.
        After ``timeout`` seconds raises WaitTimeout, whose ``job`` is where the call stands
        (its ``seq``, for ``cancel_call``); the call goes on until it ends or is canceled.
        """
        assert self._client is not None
        t = self._client._t
        body: Dict[str, Any] = {"code": code}
        for k, v in call.items():
            if k == "limits" and hasattr(v, "to_dict"):
                v = v.to_dict()
            if k == "files" and isinstance(v, Mapping):
                from .types import Spec
                v = Spec(code="", files=v).to_dict()["files"]
            body[k] = v
        poll = self._client.long_poll if timeout is None else min(self._client.long_poll, timeout)
        wait = f"{max(0, int(poll * 1000))}ms"
        status, data = t.call("POST", _session_path(self.id) + "/exec?wait=" + wait, body,
                              {"Idempotency-Key": str(uuid.uuid4())}, timeout=t.timeout + poll)
        start = t.clock()
        # A 202 is where the call stands ({seq, status, pending, links}), never a result.
        while status == 202:
            if timeout is not None and t.clock() - start > timeout:
                from .errors import WaitTimeout
                raise WaitTimeout(f"kiln: call {data.get('seq')} of session {self.id} not finished within {timeout}s", job=data)
            status, data = t.call("GET", f"{_session_path(self.id)}/calls/{int(data.get('seq') or 0)}?wait={wait}",
                                  timeout=t.timeout + poll)
        return CallResult.from_call(data or {})

    def cancel_call(self, seq: int) -> CallResult:
        """Cancel call ``seq`` of the session (a ``run`` that raised WaitTimeout names it in the
        error's ``job["seq"]``, where the call stands): one
        still waiting behind the session's earlier calls is withdrawn and never runs, a running
        one is interrupted (the interpreter and its variables stay), one that ended is left as
        it is. Waits for the call's result: status "canceled", unless it ended first. A seq
        the session has no call of raises NotFound."""
        return self._command_call("POST", f"{_session_path(self.id)}/calls/{int(seq)}/cancel")

    # --- shell commands: calls of the session, run by /bin/sh -c in /work ---

    def _command_call(self, method: str, path: str, body: Any = None, wait: Optional[float] = None) -> CallResult:
        """Send a request that makes a call of the session and wait for its result (a 202 is
        read again at its seq); one Idempotency-Key rides every try."""
        assert self._client is not None
        t, poll = self._client._t, self._client.long_poll
        w = f"{max(0, int(poll * 1000))}ms"
        sep = "&" if "?" in path else "?"
        status, data = t.call(method, path + (f"{sep}wait={w}" if wait is None else ""), body,
                              {"Idempotency-Key": str(uuid.uuid4())}, timeout=t.timeout + poll + (wait or 0))
        while status == 202:
            status, data = t.call("GET", f"{_session_path(self.id)}/calls/{int(data.get('seq') or 0)}?wait={w}",
                                  timeout=t.timeout + poll)
        return CallResult.from_call(data or {})

    def command(self, cmd: str, *, timeout: Optional[int] = None, background: bool = False,
                env: Optional[Mapping[str, str]] = None, stdin: bool = False) -> CallResult:
        """Run the shell command line ``cmd`` in the session's sandbox (cwd /work) as its next
        call and wait for it: the result's stdout, stderr and exit_code are the command's,
        ``command`` says where it stands. ``timeout`` (seconds) ends it (status "timed_out").
        With ``background`` the call ends at once: ``command["id"]`` is for
        ``wait_command``, ``write_stdin`` and ``kill_command``. ``stdin`` (background only)
        keeps the command's stdin open for ``write_stdin``; without it its stdin is empty."""
        body: Dict[str, Any] = {"cmd": cmd}
        if timeout is not None:
            body["timeout_s"] = int(timeout)
        if background:
            body["background"] = True
        if stdin:
            body["stdin"] = True
        if env:
            body["env"] = dict(env)
        return self._command_call("POST", _session_path(self.id) + "/commands", body)

    def wait_command(self, command_id: str, wait: float = 0) -> CallResult:
        """Wait up to ``wait`` seconds (at most 60) for background command ``command_id`` to end;
        its output so far is the result's stdout and stderr. An id the interpreter does not hold
        raises NotFound."""
        ms = max(0, int(wait * 1000))
        return self._command_call("GET", f"{_session_path(self.id)}/commands/{urllib.parse.quote(str(command_id), safe='')}?wait={ms}ms",
                                  wait=wait)

    def kill_command(self, command_id: str) -> CallResult:
        """Kill background command ``command_id`` (its process group)."""
        return self._command_call("POST", f"{_session_path(self.id)}/commands/{urllib.parse.quote(str(command_id), safe='')}/kill")

    def write_stdin(self, command_id: str, data: str = "", close: bool = False) -> CallResult:
        """Write ``data`` (text, at most 64 KiB a write) to the stdin of background command
        ``command_id`` (one started with ``stdin=True``), then close its stdin when ``close``:
        the command reads the end of its input. ``command["stdin"]`` says whether it is still
        open. A stdin that is not open (never opened, closed, or no longer read) raises
        Conflict (type urn:kiln:problem:stdin-closed); an unknown id raises NotFound."""
        body: Dict[str, Any] = {}
        if data:
            body["data"] = data
        if close:
            body["close"] = True
        return self._command_call("POST", f"{_session_path(self.id)}/commands/{urllib.parse.quote(str(command_id), safe='')}/stdin", body)

    def list_commands(self) -> List[Dict[str, Any]]:
        """The session's background commands (the ones its interpreter holds, running or
        ended), oldest first: each ``{"id", "cmd", "background", "running", "exit_code"?,
        "killed"?, "stdin"?}``."""
        return self._command_call("GET", _session_path(self.id) + "/commands").commands

    # --- files: /work as the last call left it; changes ordered with the calls ---

    def _file_path(self, name: str) -> str:
        return _session_path(self.id) + "/files/" + "/".join(_quote_segment(p) for p in name.split("/"))

    def _file_op(self, method: str, path: str, body: Any = None) -> Tuple[int, Any]:
        """Send a file operation until it is done: one Idempotency-Key rides every try, and a
        202 (it waits behind the session's calls) is asked again with it, so the operation
        is done once."""
        assert self._client is not None
        t, poll = self._client._t, self._client.long_poll
        sep = "&" if "?" in path else "?"
        path += f"{sep}wait={max(0, int(poll * 1000))}ms"
        key = str(uuid.uuid4())
        while True:
            status, data = t.call(method, path, body, {"Idempotency-Key": key}, timeout=t.timeout + poll)
            if status != 202:
                return status, data

    def read_file(self, name: str) -> bytes:
        """A file of the session's /work as its last call left it."""
        assert self._client is not None
        resp = self._client._t.open("GET", self._file_path(name), headers={"Accept": "*/*"})
        try:
            return resp.read()
        finally:
            resp.close()

    def write_file(self, name: str, data: Union[bytes, str]) -> FileInfo:
        """Write ``data`` (str as UTF-8) as the file ``name`` of /work: its parents are made,
        a file there is replaced. Never written through a symbolic link (FileConflict)."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        _, d = self._file_op("PUT", self._file_path(name), bytes(data))
        return FileInfo.from_dict(d or {})

    def upload(self, local: Union[str, "os.PathLike[str]"], name: Optional[str] = None) -> FileInfo:
        """Upload the local file ``local`` as ``name`` in /work (default: its base name)."""
        with open(local, "rb") as f:
            data = f.read()
        return self.write_file(name or os.path.basename(os.fspath(local)), data)

    def download(self, name: str, local: Union[None, str, "os.PathLike[str]"] = None) -> str:
        """Save the file ``name`` of /work as ``local`` (default: its base name, here);
        returns the path written."""
        data = self.read_file(name)
        out = os.fspath(local) if local is not None else posixpath.basename(name)
        with open(out, "wb") as f:
            f.write(data)
        return out

    def list_files(self, path: str = "", *, recursive: bool = False) -> List[FileInfo]:
        """The entries of the directory ``path`` of /work ("" for /work itself; every entry
        below it with ``recursive``) as the last call left them, by path: every page."""
        assert self._client is not None
        out: List[FileInfo] = []
        cursor = ""
        while True:
            q = [(k, v) for k, v in (("path", path.rstrip("/")), ("recursive", "true" if recursive else ""),
                                     ("cursor", cursor)) if v]
            _, d = self._client._t.call("GET", _session_path(self.id) + "/files" + ("?" + urllib.parse.urlencode(q) if q else ""))
            d = d or {}
            out.extend(FileInfo.from_dict(e) for e in d.get("entries") or [])
            cursor = d.get("next_cursor") or ""
            if not cursor:
                return out

    def stat(self, name: str) -> FileInfo:
        """Describe the entry ``name`` of /work: a file, a directory or a symbolic link."""
        assert self._client is not None
        _, d = self._client._t.call("GET", self._file_path(name) + "?stat=true")
        return FileInfo.from_dict(d or {})

    def exists(self, name: str) -> bool:
        """Whether /work holds ``name`` after the last call."""
        from .errors import NotFound
        try:
            self.stat(name)
            return True
        except NotFound:
            return False

    def remove(self, name: str, *, recursive: bool = False) -> None:
        """Remove the entry ``name`` of /work (a link, never its target; a directory only when
        empty, or with ``recursive``)."""
        self._file_op("DELETE", self._file_path(name) + ("?recursive=true" if recursive else ""))

    def mkdir(self, name: str) -> FileInfo:
        """Make the directory ``name`` (and its parents) in /work; one already there is fine."""
        _, d = self._file_op("POST", _session_path(self.id) + "/files", {"op": "mkdir", "path": name})
        return FileInfo.from_dict(d or {})

    def move(self, src: str, dst: str, *, overwrite: bool = False) -> FileInfo:
        """Rename ``src`` to ``dst`` in /work (dst's parents made; with ``overwrite``, what is
        at dst is replaced); returns the entry at dst."""
        body: Dict[str, Any] = {"op": "move", "path": src, "to": dst}
        if overwrite:
            body["overwrite"] = True
        _, d = self._file_op("POST", _session_path(self.id) + "/files", body)
        return FileInfo.from_dict(d or {})

    def refresh(self) -> "Session":
        assert self._client is not None
        _, data = self._client._t.call("GET", _session_path(self.id))
        return self._update(data)

    def pause(self, *, timeout: Optional[float] = None) -> "Session":
        """Free the session's sandbox and memory once the calls accepted before have ended,
        keeping its id, files and call history; returns once it is paused (``status`` "paused").
        A paused session no longer counts among the key's live sessions; ``resume()`` or its
        next call brings it back."""
        assert self._client is not None
        t = self._client._t
        poll = self._client.long_poll if timeout is None else min(self._client.long_poll, timeout)
        wait = f"{max(0, int(poll * 1000))}ms"
        start = t.clock()
        while True:
            status, data = t.call("POST", _session_path(self.id) + "/pause?wait=" + wait, timeout=t.timeout + poll)
            self._update(data)
            if status != 202:
                return self
            if timeout is not None and t.clock() - start > timeout:
                from .errors import WaitTimeout
                raise WaitTimeout(f"kiln: session {self.id} not paused within {timeout}s (a call still running)")

    def resume(self) -> "Session":
        """Bring a paused session back on a worker; ``restored`` then says what came back:
        "files+variables" (a python session: its files and the variables its pause kept; what
        could not be kept is named in the next call's ``session_note``), "files" (its /work
        files, not its variables) or "files+replay" (its files, then its successful calls run
        again). A session that is not paused is read as it is."""
        assert self._client is not None
        _, data = self._client._t.call("POST", _session_path(self.id) + "/resume")
        return self._update(data)

    def close(self) -> None:
        """End the session and remove its sandbox (an ended session stays ended)."""
        assert self._client is not None
        from .errors import NotFound
        try:
            _, data = self._client._t.call("DELETE", _session_path(self.id))
            self.status = (data or {}).get("status", "ended")
        except NotFound:
            self.status = "ended"
