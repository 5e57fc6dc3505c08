"""Exceptions raised by the Kiln client, mapped from the API's RFC 9457 problem types.

Branch on the class (``except kiln.RateLimited``) or on ``err.type`` / ``err.field``;
never on the message text.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from . import _schema
from ._schema import PROBLEM_PREFIX


class KilnError(Exception):
    """Base class of every error the client raises.

    For an answer of the API, ``status`` is the HTTP status and ``type``, ``title``,
    ``detail``, ``field`` and ``limit`` come from the problem document. ``retry_after``
    is the server's Retry-After in seconds, when it sent one.
    """

    def __init__(self, message: str, *, status: int = 0, type: str = "", title: str = "",
                 detail: str = "", field: str = "", limit: Optional[int] = None,
                 retry_after: Optional[float] = None, problem: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.field = field
        self.limit = limit
        self.retry_after = retry_after
        self.problem = problem or {}

    @property
    def temporary(self) -> bool:
        """True when the same request may succeed later unchanged (429, 5xx, network)."""
        return False


class InvalidRequest(KilnError):
    """400/413/415/422: the request is wrong; ``field`` names what to fix."""


class PayloadTooLarge(InvalidRequest):
    """413: the request body is over the server's limit (``limit`` bytes)."""


class Unauthorized(KilnError):
    """401: no API key, or not a valid one."""


class NotFound(KilnError):
    """404: no such job (or artifact, or endpoint)."""


class MethodNotAllowed(KilnError):
    """405: the path exists for other methods."""


class Conflict(KilnError):
    """The Idempotency-Key was used before with a different request body."""


class EgressNotAllowed(InvalidRequest):
    """422: the job's network names a host the API key does not allow (or the key allows
    no network); ``field`` is network.allow[i]. Retrying will not help."""


class BudgetExhausted(KilnError):
    """409: the execution budget the job names cannot cover it; retrying will not help."""


class RateLimited(KilnError):
    """429: try again after ``retry_after`` seconds."""

    @property
    def temporary(self) -> bool:
        return True


class QueueFull(RateLimited):
    """429: the job queue is at its limit; nothing was queued."""


class QuotaExceeded(RateLimited):
    """429: one of the API key's quotas refuses the request (``type`` names which:
    quota-exceeded:max_queued, :submissions_per_second, :cpu_seconds_per_day, :sessions;
    ``limit`` is the quota). A retry helps only after ``retry_after`` seconds, when the
    server sent one; otherwise wait for jobs to end or sessions to be deleted."""

    @property
    def temporary(self) -> bool:
        return self.retry_after is not None


class ResponseTooLarge(KilnError):
    """413 within a list answer: the job was left out to keep the answer within the
    server's bound (``limit`` bytes); read it on its own."""


class ReplayUnavailable(KilnError):
    """409: the job cannot be replayed as it ran (its inputs or its image are gone)."""


class SessionEnded(KilnError):
    """410: the session has ended (deleted, idle, past its lifetime); make a new one."""


class FileConflict(KilnError):
    """409: the session's files make the file operation impossible: something already
    there, a file where a directory is needed, a directory not empty, a symbolic link
    in the way, or /work at its bound. ``title`` and ``detail`` say which, ``field``
    names the path at fault (path or to). Retrying as it is will not help."""


class Unavailable(KilnError):
    """503: a dependency of the API (queue, job store) is down; nothing was changed."""

    @property
    def temporary(self) -> bool:
        return True


class ServerError(KilnError):
    """500 and other 5xx answers."""

    @property
    def temporary(self) -> bool:
        return self.status != 500 and self.status != 501


class ConnectionFailed(KilnError):
    """The API could not be reached, or the connection broke before an answer."""

    @property
    def temporary(self) -> bool:
        return True


class WaitTimeout(KilnError):
    """The job did not finish before the deadline given to wait(); ``job`` is its last state
    (for a session call, where the call stands: its ``seq``, for ``Session.cancel_call``)."""

    def __init__(self, message: str, job: Any = None) -> None:
        super().__init__(message)
        self.job = job


class IntegrityError(KilnError):
    """A downloaded artifact's SHA-256 is not the one the server listed."""


class DecodeError(KilnError):
    """An answer the client could not decode: not JSON, or nested deeper than Python's
    decoder reads (a RecursionError is this error, never raised as itself)."""


# The tables are generated from the API's OpenAPI document (_schema.py): every
# problem type it names has its class here.
_BY_TYPE = {t: globals()[name] for t, name in _schema.ERROR_CLASS_BY_TYPE.items()}
_BY_STATUS = {status: globals()[name] for status, name in _schema.ERROR_CLASS_BY_STATUS.items()}


def error_class(status: int, problem_type: str = "") -> type:
    """The exception class for an answer: by problem type first, then by HTTP status."""
    if problem_type.startswith(PROBLEM_PREFIX):
        cls = _BY_TYPE.get(problem_type[len(PROBLEM_PREFIX):])
        if cls is not None:
            return cls
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return ServerError
    if status >= 400:
        return InvalidRequest
    return KilnError


def from_problem(status: int, problem: Dict[str, Any], retry_after: Optional[float]) -> KilnError:
    """Build the exception for a non-2xx answer whose body was ``problem`` (may be {})."""
    ptype = str(problem.get("type") or "")
    title = str(problem.get("title") or "")
    detail = str(problem.get("detail") or "")
    field = str(problem.get("field") or "")
    limit = problem.get("limit")
    msg = f"kiln: {status} {title or 'error'}"
    if detail:
        msg += f": {detail}"
    if field:
        msg += f" (field {field})"
    cls = error_class(status, ptype)
    return cls(msg, status=status, type=ptype, title=title, detail=detail, field=field,
               limit=int(limit) if isinstance(limit, (int, float)) else None,
               retry_after=retry_after, problem=problem)
