"""Sessions: a sandbox whose interpreter and /work are kept between calls.

    with client.session() as s:
        s.run("import pandas as pd; df = pd.read_csv('data.csv')")
        print(s.run("print(df.describe())").stdout)

Variables, imports, the current directory and files persist from call to call.
A call's result is a ``Result`` plus ``seq``, ``incarnation`` and
``state_restored`` (False when the call found a fresh interpreter: the session's
memory cap, or its worker lost; ``session_note`` says what to do).
"""
from __future__ import annotations

import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

from .types import Result

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client


def _session_path(session_id: str) -> str:
    return "/v1/sessions/" + urllib.parse.quote(session_id, safe="")


@dataclass
class CallResult(Result):
    """One call of a session: a job's Result plus where it stands in its session."""
    seq: int = 0
    incarnation: int = 0
    state_restored: bool = True
    session_note: str = ""

    @classmethod
    def from_call(cls, d: Mapping[str, Any]) -> "CallResult":
        base = Result.from_dict(d)
        out = cls(**{f: getattr(base, f) for f in base.__dataclass_fields__})
        out.seq = int(d.get("seq") or 0)
        out.incarnation = int(d.get("incarnation") or 0)
        out.state_restored = bool(d.get("state_restored"))
        out.session_note = d.get("session_note") or ""
        return out


@dataclass
class Session:
    """A session of the API. Use ``run(code)``; ``close()`` (or a ``with`` block) ends it."""
    id: str
    status: str = ""
    runtime: str = ""
    incarnation: int = 0
    expires_at: Optional[str] = None
    metadata: Dict[str, str] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    _client: Optional["Client"] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], client: "Client") -> "Session":
        return cls(id=str(d.get("id") or ""), status=str(d.get("status") or ""), runtime=str(d.get("runtime") or ""),
                   incarnation=int(d.get("incarnation") or 0), expires_at=d.get("expires_at"),
                   metadata=dict(d.get("metadata") or {}), raw=dict(d), _client=client)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(self, code: str, *, timeout: Optional[float] = None, **call: Any) -> CallResult:
        """Run ``code`` as the session's next call and wait for its result.

        Extra call fields go as keyword arguments (stdin, args, env, files, limits,
        budget: a budget id the call is charged to).
        Every try carries one Idempotency-Key, so a retry never runs the call twice.
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
                raise WaitTimeout(f"kiln: call {data.get('seq')} of session {self.id} not finished within {timeout}s")
            status, data = t.call("GET", f"{_session_path(self.id)}/calls/{int(data.get('seq') or 0)}?wait={wait}",
                                  timeout=t.timeout + poll)
        return CallResult.from_call(data or {})

    def read_file(self, name: str) -> bytes:
        """A file of the session's /work as its last call left it."""
        assert self._client is not None
        parts = "/".join(urllib.parse.quote(p, safe="") for p in name.split("/"))
        resp = self._client._t.open("GET", _session_path(self.id) + "/files/" + parts)
        try:
            return resp.read()
        finally:
            resp.close()

    def refresh(self) -> "Session":
        assert self._client is not None
        _, data = self._client._t.call("GET", _session_path(self.id))
        fresh = Session.from_dict(data or {}, self._client)
        self.status, self.incarnation, self.raw = fresh.status, fresh.incarnation, fresh.raw
        return self

    def close(self) -> None:
        """End the session and remove its sandbox (an ended session stays ended)."""
        assert self._client is not None
        from .errors import NotFound
        try:
            _, data = self._client._t.call("DELETE", _session_path(self.id))
            self.status = (data or {}).get("status", "ended")
        except NotFound:
            self.status = "ended"
