"""HTTP transport: one request at a time over urllib, retries with backoff.

urllib (not raw asyncio streams) because it already does HTTP/1.1, chunked
bodies, TLS, proxies and redirects correctly; the async client runs these
calls on worker threads instead of re-implementing HTTP.
"""
from __future__ import annotations

import http.client
import json
import random
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from . import errors

USER_AGENT = "kiln-python/0.1"


@dataclass
class RetryPolicy:
    """How a request is retried on 429, 503 and network errors.

    The n-th retry waits a random time between half and all of
    ``min(max_backoff, initial_backoff * multiplier**n)`` (jitter, so clients
    that failed together do not come back together), and never less than the
    server's Retry-After. No retry starts after ``max_elapsed`` seconds.
    """
    max_attempts: int = 8          # tries of one request, the first included; default 8
    initial_backoff: float = 0.2   # seconds; default 0.2
    max_backoff: float = 10.0      # seconds; default 10
    multiplier: float = 2.0        # default 2
    max_elapsed: float = 60.0      # seconds; default 60

    def backoff(self, retry: int, retry_after: Optional[float] = None) -> float:
        ceiling = min(self.max_backoff, self.initial_backoff * (self.multiplier ** retry))
        delay = random.uniform(ceiling / 2, ceiling)
        if retry_after is not None and retry_after > delay:
            # At least what the server asked for, plus a little spread.
            delay = retry_after + random.uniform(0, min(1.0, retry_after * 0.1))
        return delay


NO_RETRY = RetryPolicy(max_attempts=1)


class Response:
    """A 2xx answer: status, headers, and the open body (read or iterate it, then close)."""

    def __init__(self, status: int, headers: Any, body: Any) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def read(self) -> bytes:
        try:
            return self.body.read()
        finally:
            self.body.close()

    def json(self) -> Any:
        """The body as JSON; errors.DecodeError when it cannot be decoded."""
        return decode_json(self.read(), status=self.status)

    def close(self) -> None:
        self.body.close()


def decode_json(raw: Any, status: int = 0, what: str = "answer") -> Any:
    """Decodes JSON text (None for an empty body). Anything the decoder cannot read --
    not JSON, or nested past its recursion limit -- raises errors.DecodeError, never
    ValueError or RecursionError: an agent loop catching KilnError keeps running."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise errors.DecodeError(f"kiln: the {what} could not be decoded: {type(e).__name__}: {e}",
                                 status=status) from None


# Network errors after which the request surely never reached the server.
_NOT_SENT = (ConnectionRefusedError, socket.gaierror)
# Network errors of any kind (the request may or may not have been processed).
NETWORK_ERRORS = (OSError, http.client.HTTPException)


def _retry_after(headers: Any) -> Optional[float]:
    v = headers.get("Retry-After") if headers is not None else None
    if not v:
        return None
    try:
        return max(0.0, float(v))
    except ValueError:
        return None


class Transport:
    """Sends requests to one API; raises errors.KilnError subclasses for everything but 2xx."""

    def __init__(self, server: str, api_key: Optional[str], timeout: float, retry: RetryPolicy,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        u = urllib.parse.urlsplit(server)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError(f"kiln: server URL {server!r} must be http:// or https:// with a host")
        self.base = server.rstrip("/")
        self.api_key = api_key or None
        self.timeout = timeout
        self.retry = retry
        self.sleep = sleep
        self.clock = clock
        self._opener = urllib.request.build_opener()

    def open(self, method: str, path: str, body: Any = None, headers: Optional[Mapping[str, str]] = None,
             timeout: Optional[float] = None) -> Response:
        """One attempt: body is sent as JSON, or as it is when it is bytes. Non-2xx answers
        raise their KilnError; network errors ConnectionFailed (with ``sent`` False when the
        request surely did not reach the server)."""
        data = None
        hdrs = {"Accept": "application/json, application/problem+json", "User-Agent": USER_AGENT}
        if isinstance(body, (bytes, bytearray, memoryview)):
            data = bytes(body)  # sent as it is (a session file's upload)
            hdrs["Content-Type"] = "application/octet-stream"
        elif body is not None:
            data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
            hdrs["Content-Type"] = "application/json"
        if self.api_key:
            hdrs["Authorization"] = "Bearer " + self.api_key
        hdrs.update(headers or {})
        req = urllib.request.Request(self.base + path, data=data, headers=hdrs, method=method)
        try:
            resp = self._opener.open(req, timeout=timeout if timeout is not None else self.timeout)
        except urllib.error.HTTPError as e:
            raise self._error(e.code, e.headers, e) from None
        except urllib.error.URLError as e:
            raise self._network(method, path, e.reason) from e
        except NETWORK_ERRORS as e:
            raise self._network(method, path, e) from e
        return Response(resp.status, resp.headers, resp)

    def _network(self, method: str, path: str, reason: Any) -> errors.ConnectionFailed:
        err = errors.ConnectionFailed(f"kiln: {method} {self.base}{path}: {reason}")
        err.sent = not isinstance(reason, _NOT_SENT)  # type: ignore[attr-defined]
        return err

    def _error(self, status: int, headers: Any, body: Any) -> errors.KilnError:
        try:
            raw = body.read()
        except NETWORK_ERRORS:
            raw = b""
        finally:
            body.close()
        problem: Dict[str, Any] = {}
        try:
            parsed = decode_json(raw, status)
            if isinstance(parsed, dict):
                problem = parsed
        except errors.DecodeError:
            text = raw.decode("utf-8", "replace").strip()
            problem = {"title": http.client.responses.get(status, "Error"), "detail": text[:200]}
        return errors.from_problem(status, problem, _retry_after(headers))

    def _once(self, method: str, path: str, body: Any, headers: Optional[Mapping[str, str]],
              timeout: Optional[float]) -> Tuple[int, Any]:
        resp = self.open(method, path, body, headers, timeout)
        try:
            return resp.status, resp.json()
        except NETWORK_ERRORS as e:
            raise self._network(method, path, e) from e
        except errors.DecodeError as e:
            e.args = (f"kiln: {method} {path}: {e}",)
            raise

    def call(self, method: str, path: str, body: Any = None, headers: Optional[Mapping[str, str]] = None,
             timeout: Optional[float] = None, retry: Optional[RetryPolicy] = None,
             only_unsent: bool = False) -> Tuple[int, Any]:
        """open() with retries on 429, temporary 5xx and network errors; returns (status, JSON).

        only_unsent: retry network errors only when the request surely was not sent
        (for requests that are not idempotent).
        """
        policy = retry or self.retry
        start = self.clock()
        attempt = 0
        while True:
            try:
                return self._once(method, path, body, headers, timeout)
            except errors.KilnError as e:
                if not e.temporary or (only_unsent and isinstance(e, errors.ConnectionFailed)
                                       and getattr(e, "sent", True)):
                    raise
                attempt += 1
                delay = policy.backoff(attempt - 1, e.retry_after)
                if attempt >= policy.max_attempts or self.clock() - start + delay > policy.max_elapsed:
                    raise
                self.sleep(delay)
