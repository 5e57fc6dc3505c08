"""The synchronous Kiln client."""
from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.parse
import uuid
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from . import _sse, errors
from ._transport import NETWORK_ERRORS, NO_RETRY, RetryPolicy, Transport
from .types import Artifact, BatchItem, Event, JobPage, JobSummary, Result, Spec

if TYPE_CHECKING:  # pragma: no cover
    from .sessions import Session

DEFAULT_SERVER = "http://127.0.0.1:8080"

SpecLike = Union[str, Spec, Mapping[str, Any]]


def _spec_dict(code_or_spec: SpecLike, kw: Mapping[str, Any]) -> Dict[str, Any]:
    if isinstance(code_or_spec, str):
        return Spec(code=code_or_spec, **kw).to_dict()
    if kw:
        raise TypeError("give spec fields either as a Spec/dict or as keyword arguments, not both")
    if isinstance(code_or_spec, Spec):
        return code_or_spec.to_dict()
    return dict(code_or_spec)


def _job_path(job_id: str) -> str:
    # Escaped, so a malformed id gets the API's 400 instead of reaching another route.
    return "/v1/jobs/" + urllib.parse.quote(job_id, safe="")


def _wait_param(seconds: float) -> str:
    return f"{max(0, int(seconds * 1000))}ms"


class Client:
    """A client of one Kiln API.

    ``server`` and ``api_key`` default to $KILN_SERVER (else http://127.0.0.1:8080)
    and $KILN_API_KEY. ``timeout`` bounds each plain request (seconds); long-polls
    get their wait on top. ``retry`` paces retries of 429, 503 and network errors.
    ``long_poll`` is how long one wait request is held by the server (it caps it, 60 s by default).
    """

    def __init__(self, server: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: float = 30.0, retry: Optional[RetryPolicy] = None, long_poll: float = 30.0) -> None:
        server = server or os.environ.get("KILN_SERVER") or DEFAULT_SERVER
        if api_key is None:
            api_key = os.environ.get("KILN_API_KEY")
        self._t = Transport(server, api_key, timeout, retry or RetryPolicy())
        self.long_poll = long_poll

    @property
    def server(self) -> str:
        return self._t.base

    # --- jobs -------------------------------------------------------------

    def submit(self, code_or_spec: SpecLike, *, wait: Optional[float] = None,
               idempotency_key: Optional[str] = None, **spec: Any) -> Result:
        """Submit one job; returns at once (``accepted`` True) unless ``wait`` seconds are given.

        Every submission carries an Idempotency-Key (a new UUID unless given), and is
        retried with that same key on 429, 503 and network errors, so a retry never
        creates a second job. Spec fields go as keyword arguments (runtime, stdin, args,
        env, files, limits, cache) or as a Spec / dict.
        """
        body = _spec_dict(code_or_spec, spec)
        key = idempotency_key or str(uuid.uuid4())
        path = "/v1/jobs"
        timeout = None
        if wait:
            path += "?wait=" + _wait_param(wait)
            timeout = self._t.timeout + wait
        status, data = self._t.call("POST", path, body, {"Idempotency-Key": key}, timeout=timeout)
        return Result.from_dict(data or {}, accepted=status == 202)

    def get(self, job_id: str, wait: Optional[float] = None) -> Result:
        """Read a job; with ``wait`` seconds the server holds the answer until it finishes or wait passes."""
        path = _job_path(job_id)
        timeout = None
        if wait:
            path += "?wait=" + _wait_param(wait)
            timeout = self._t.timeout + wait
        _, data = self._t.call("GET", path, timeout=timeout)
        return Result.from_dict(data or {})

    def wait(self, job_id: str, timeout: Optional[float] = None) -> Result:
        """Long-poll until the job finishes; raises WaitTimeout after ``timeout`` seconds (None: no limit).

        Survives an API restart or outage: connection refused or reset, 429 and 503
        are waited out with backoff and polling resumes until the deadline.
        """
        t = self._t
        deadline = None if timeout is None else t.clock() + timeout
        retries, last = 0, None
        while True:
            remaining = None if deadline is None else deadline - t.clock()
            if remaining is not None and remaining <= 0:
                raise errors.WaitTimeout(f"kiln: job {job_id} not finished within {timeout}s", job=last)
            poll = self.long_poll if remaining is None else max(0.001, min(self.long_poll, remaining))
            try:
                _, data = t._once("GET", _job_path(job_id) + "?wait=" + _wait_param(poll), None, None,
                                  t.timeout + poll)
                last = Result.from_dict(data or {})
                retries = 0
                if last.done:
                    return last
                continue
            except errors.KilnError as e:
                if not e.temporary:
                    raise
                delay = t.retry.backoff(retries, e.retry_after)
                retries += 1
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - t.clock()))
            t.sleep(delay)

    def run(self, code_or_spec: SpecLike, *, timeout: Optional[float] = None, **spec: Any) -> Result:
        """Submit and wait for the result (``timeout`` seconds in all; None: no limit)."""
        start = self._t.clock()
        first_wait = self.long_poll if timeout is None else min(self.long_poll, timeout)
        res = self.submit(code_or_spec, wait=first_wait, **spec)
        if res.done:
            return res
        remaining = None if timeout is None else max(0.0, timeout - (self._t.clock() - start))
        return self.wait(res.id, timeout=remaining)

    def cancel(self, job_id: str) -> Result:
        """Cancel a job: a queued one at once; a running one is asked to stop; a finished one stays."""
        _, data = self._t.call("DELETE", _job_path(job_id))
        return Result.from_dict(data or {})

    def batch(self, specs: Sequence[SpecLike]) -> List[BatchItem]:
        """Submit up to 100 jobs in one request; each item says what that job got.

        Batches carry no idempotency key, so a network error is retried only when the
        request surely never reached the server (connection refused); 429/503 answers
        (nothing was queued) are retried too.
        """
        body = {"jobs": [_spec_dict(s, {}) for s in specs]}
        _, data = self._t.call("POST", "/v1/jobs/batch", body, only_unsent=True)
        items = []
        for it in (data or {}).get("jobs", []):
            status = int(it.get("status") or 0)
            item = BatchItem(index=int(it.get("index") or 0), status=status)
            if it.get("error"):
                item.error = errors.from_problem(status, it["error"], None)
            elif it.get("job"):
                item.job = Result.from_dict(it["job"], accepted=status == 202)
            items.append(item)
        return items

    def jobs(self, ids: Sequence[str]) -> List[Optional[Result]]:
        """Read up to 100 jobs at once, in order; an unknown id gives None."""
        q = ",".join(urllib.parse.quote(i, safe="") for i in ids)
        _, data = self._t.call("GET", "/v1/jobs?ids=" + q)
        out: List[Optional[Result]] = []
        for j in (data or {}).get("jobs", []):
            out.append(Result.from_dict(j) if j.get("status") else None)
        return out

    def wait_all(self, ids: Sequence[str], timeout: Optional[float] = None) -> List[Result]:
        """Wait until every job finishes; results in the order of ids.

        Polls the unfinished ones together (GET /v1/jobs?ids=), long-polling the first
        of them so an idle wait costs one request per long-poll period.
        """
        t = self._t
        deadline = None if timeout is None else t.clock() + timeout
        done: Dict[str, Result] = {}
        retries = 0
        while True:
            pending = [i for i in ids if i not in done]
            if not pending:
                return [done[i] for i in ids]
            try:
                for start in range(0, len(pending), 100):
                    chunk = pending[start:start + 100]
                    for jid, r in zip(chunk, self.jobs(chunk)):
                        if r is None:
                            raise errors.NotFound(f"kiln: job {jid} not found", status=404)
                        if r.done:
                            done[jid] = r
                pending = [i for i in ids if i not in done]
                if not pending:
                    continue
                remaining = None if deadline is None else deadline - t.clock()
                if remaining is not None and remaining <= 0:
                    raise errors.WaitTimeout(f"kiln: {len(pending)} of {len(ids)} jobs not finished within {timeout}s")
                self.get(pending[0], wait=self.long_poll if remaining is None else min(self.long_poll, remaining))
                retries = 0
            except errors.KilnError as e:
                if not e.temporary:
                    raise
                if deadline is not None and t.clock() >= deadline:
                    raise errors.WaitTimeout(f"kiln: jobs not finished within {timeout}s") from e
                t.sleep(t.retry.backoff(retries, e.retry_after))
                retries += 1

    def runtimes(self) -> List[Dict[str, Any]]:
        """The runtimes the fleet offers, with image digests and limits policies."""
        _, data = self._t.call("GET", "/v1/runtimes")
        return list((data or {}).get("runtimes", []))

    # --- artifacts --------------------------------------------------------

    def artifact(self, job_id: str, artifact: Union[str, Artifact], path: Union[None, str, os.PathLike] = None) -> Any:
        """Download an artifact; returns its bytes, or writes it to ``path`` and returns the path.

        The content's SHA-256 is checked against the listed hash (an Artifact) or the
        ETag the server sent; a mismatch raises IntegrityError and writes nothing.
        """
        name = artifact.name if isinstance(artifact, Artifact) else artifact
        expected = artifact.sha256 if isinstance(artifact, Artifact) else ""
        url = _job_path(job_id) + "/artifacts/" + urllib.parse.quote(name, safe="")
        retries = 0
        while True:
            try:
                return self._download(url, name, expected, path)
            except errors.KilnError as e:
                if not e.temporary or retries + 1 >= self._t.retry.max_attempts:
                    raise
                self._t.sleep(self._t.retry.backoff(retries, e.retry_after))
                retries += 1

    def _download(self, url: str, name: str, expected: str, path: Any) -> Any:
        resp = self._t.open("GET", url, headers={"Accept": "*/*"})
        etag = (resp.headers.get("ETag") or "").strip().strip('"')
        if etag.startswith("W/"):
            etag = ""
        want = (expected or etag).lower()
        if want.startswith("sha256:"):
            want = want[len("sha256:"):]
        h = hashlib.sha256()
        tmp = None
        chunks: List[bytes] = []
        try:
            if path is not None:
                d = os.path.dirname(os.path.abspath(os.fspath(path)))
                fd, tmp = tempfile.mkstemp(prefix=".kiln-", dir=d)
                out = os.fdopen(fd, "wb")
            try:
                while True:
                    try:
                        b = resp.body.read(1 << 16)
                    except NETWORK_ERRORS as e:
                        raise self._t._network("GET", url, e) from e
                    if not b:
                        break
                    h.update(b)
                    if path is not None:
                        out.write(b)
                    else:
                        chunks.append(b)
            finally:
                resp.close()
                if path is not None:
                    out.close()
            got = h.hexdigest()
            if want and got != want:
                raise errors.IntegrityError(f"kiln: artifact {name!r}: sha256 {got}, expected {want}")
            if path is None:
                return b"".join(chunks)
            os.replace(tmp, path)
            tmp = None
            return path
        finally:
            if tmp is not None:
                os.unlink(tmp)

    # --- live output ------------------------------------------------------

    def events(self, job_id: str, *, last_event_id: Optional[str] = None,
               timeout: Optional[float] = None, idle_timeout: float = 75.0) -> Iterator[Event]:
        """Iterate over the job's live events (status, stdout, stderr, artifacts, result).

        Ends after the ``result`` event. When the connection breaks (or the API
        restarts) it reconnects with Last-Event-ID, so no event is repeated or lost
        beyond what the server retains. ``timeout`` bounds the whole iteration
        (WaitTimeout); ``idle_timeout`` a silence on the connection.
        """
        t = self._t
        deadline = None if timeout is None else t.clock() + timeout
        last = last_event_id
        retries = 0
        while True:
            headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
            if last is not None:
                headers["Last-Event-ID"] = last
            err: Optional[errors.KilnError] = None
            try:
                resp = t.open("GET", _job_path(job_id) + "/events", headers=headers, timeout=idle_timeout)
            except errors.KilnError as e:
                if not e.temporary:
                    raise
                err = e
            else:
                try:
                    for ev in _sse.parse(resp.body.readline):
                        retries = 0
                        last = _sse.last_id(last, ev)
                        yield ev
                        if ev.type == "result":
                            return
                except NETWORK_ERRORS:
                    pass  # reconnect below
                finally:
                    resp.close()
            if deadline is not None and t.clock() >= deadline:
                raise errors.WaitTimeout(f"kiln: events of job {job_id} did not end within {timeout}s")
            delay = t.retry.backoff(retries, err.retry_after if err else None)
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - t.clock()))
            t.sleep(delay)
            retries += 1

    # --- listing, replay, audit -------------------------------------------

    def list_jobs(self, *, status: Optional[str] = None, tags: Optional[Mapping[str, str]] = None,
                  created_after: Optional[str] = None, created_before: Optional[str] = None,
                  cursor: Optional[str] = None, limit: Optional[int] = None) -> JobPage:
        """A page of this API key's jobs, newest first (GET /v1/jobs): filtered by status,
        metadata (``tags``: every pair must hold) and creation time (RFC 3339 strings);
        pass the page's ``next_cursor`` as ``cursor`` for the next one."""
        q: List[Any] = []
        for name, v in (("status", status), ("created_after", created_after), ("created_before", created_before),
                        ("cursor", cursor), ("limit", limit)):
            if v is not None:
                q.append((name, str(v)))
        for k, v in (tags or {}).items():
            q.append(("tag", f"{k}={v}"))
        _, data = self._t.call("GET", "/v1/jobs?" + urllib.parse.urlencode(q))
        data = data or {}
        return JobPage(jobs=[JobSummary.from_dict(j) for j in data.get("jobs") or [] if isinstance(j, dict)],
                       next_cursor=data.get("next_cursor") or None)

    def iter_jobs(self, **filters: Any) -> Iterator[JobSummary]:
        """Every job list_jobs(**filters) would list, page after page."""
        cursor = filters.pop("cursor", None)
        while True:
            page = self.list_jobs(cursor=cursor, **filters)
            yield from page.jobs
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def replay(self, job_id: str) -> Result:
        """Queue job ``job_id`` again as it ran (same code, inputs, limits and image digest);
        the new job's ``replay_of`` names it and ``replay`` compares the outcomes once it ends.
        Not retried: each call queues a job."""
        status, data = self._t.call("POST", _job_path(job_id) + "/replay", None, retry=NO_RETRY)
        return Result.from_dict(data or {}, accepted=status == 202)

    def audit(self, *, since: Optional[str] = None, kind: Optional[str] = None,
              limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """This API key's audit records (GET /v1/audit), oldest first: from ``since`` (RFC 3339)
        on, of ``kind`` (submission, result, cancel, ...), at most ``limit``."""
        q = {k: str(v) for k, v in (("since", since), ("kind", kind), ("limit", limit)) if v is not None}
        path = "/v1/audit" + ("?" + urllib.parse.urlencode(q) if q else "")
        _, data = self._t.call("GET", path)
        return list((data or {}).get("records") or [])

    # --- budgets ----------------------------------------------------------

    def create_budget(self, *, max_runs: Optional[int] = None, max_cpu_ms: Optional[int] = None,
                      max_wall_ms: Optional[int] = None, max_artifact_bytes: Optional[int] = None,
                      expires_s: Optional[int] = None) -> Dict[str, Any]:
        """Create an execution budget; jobs naming its ``id`` (``budget=``) are refused with
        BudgetExhausted once it cannot cover them. Returns the budget as the API shows it."""
        body = {k: v for k, v in {"max_runs": max_runs, "max_cpu_ms": max_cpu_ms, "max_wall_ms": max_wall_ms,
                                  "max_artifact_bytes": max_artifact_bytes, "expires_s": expires_s}.items()
                if v is not None}
        _, data = self._t.call("POST", "/v1/budgets", body)
        return data or {}

    def get_budget(self, budget_id: str) -> Dict[str, Any]:
        """A budget with what its runs used (``used``) and what jobs in flight hold (``reserved``)."""
        _, data = self._t.call("GET", "/v1/budgets/" + urllib.parse.quote(budget_id, safe=""))
        return data or {}

    # --- sessions ---------------------------------------------------------

    def session(self, *, runtime: Optional[str] = None, **spec: Any) -> "Session":
        """Create a session: a sandbox whose interpreter and /work persist between calls.

        Session fields go as keyword arguments (limits, memory_mb, idle_timeout_s,
        max_lifetime_s, files, restore, network, metadata, env: every call's environment
        under the call's own). Use it in a ``with`` block, or close() it.
        """
        from .sessions import Session
        body: Dict[str, Any] = dict(spec)
        if runtime:
            body["runtime"] = runtime
        if hasattr(body.get("limits"), "to_dict"):
            body["limits"] = body["limits"].to_dict()
        if isinstance(body.get("files"), Mapping):
            body["files"] = Spec(code="", files=body["files"]).to_dict()["files"]
        _, data = self._t.call("POST", "/v1/sessions", body, only_unsent=True, timeout=self._t.timeout + 120)
        return Session.from_dict(data or {}, self)

    def get_session(self, session_id: str) -> "Session":
        """An existing session of this API key, by id."""
        from .sessions import Session, _session_path
        _, data = self._t.call("GET", _session_path(session_id))
        return Session.from_dict(data or {}, self)

    def sessions(self, *, tags: Optional[Mapping[str, str]] = None) -> List["Session"]:
        """This API key's live sessions, oldest first; with ``tags``, those whose metadata
        holds every pair."""
        from .sessions import Session
        q = [("tag", f"{k}={v}") for k, v in (tags or {}).items()]
        _, data = self._t.call("GET", "/v1/sessions" + ("?" + urllib.parse.urlencode(q) if q else ""))
        return [Session.from_dict(d, self) for d in (data or {}).get("sessions") or [] if isinstance(d, dict)]

    # --- tools ------------------------------------------------------------

    def run_tool_call(self, call: Mapping[str, Any], *, timeout: Optional[float] = None,
                      runtime: Optional[str] = None, budget: Optional[str] = None) -> Dict[str, Any]:
        """Run a model's tool call (Anthropic tool_use block, OpenAI Chat Completions tool
        call, or OpenAI Responses function_call) and return the tool-result block in the
        same vendor's format.

        The call goes to ``POST /v1/tool-calls`` and the block returned is the server's,
        exactly: the same text (stdout, stderr, display outputs, the exception, what to
        do next) and the same images (figures, image artifacts) as the API and
        ``kiln mcp`` give: Anthropic image blocks, Responses input_image parts; a Chat
        Completions tool message is text only, ending with where the images are.
        ``runtime`` overrides the runtime the tool name gives; ``timeout`` bounds the
        wait (default: the server's, the job's time limit plus its queueing); ``budget``
        names the execution budget the run is charged to (BudgetExhausted once it is
        used up)."""
        from . import tools
        try:
            body, _, _ = tools.server_call(call, runtime=runtime)
        except tools.ToolCallError as e:
            return tools.error_result(str(e), e.call_id, e.format)
        wait = timeout if timeout is not None else tools.MAX_TIMEOUT_S + 60
        path = "/v1/tool-calls"
        if budget:
            path += "?budget=" + urllib.parse.quote(budget, safe="")
        _, data = self._t.call("POST", path, body, {"Idempotency-Key": str(uuid.uuid4())},
                               timeout=self._t.timeout + wait)
        return data

