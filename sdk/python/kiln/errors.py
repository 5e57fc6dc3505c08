"""Exceptions raised by the Kiln client, mapped from the API's RFC 9457 problem types.

Branch on the class (``except kiln.RateLimited``) or on ``err.type`` / ``err.field``;
never on the message text.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

PROBLEM_PREFIX = "urn:kiln:problem:"


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
    """The job did not finish before the deadline given to wait(); ``job`` is its last state."""

    def __init__(self, message: str, job: Any = None) -> None:
        super().__init__(message)
        self.job = job


class IntegrityError(KilnError):
    """A downloaded artifact's SHA-256 is not the one the server listed."""


_BY_TYPE = {
    "malformed-json": InvalidRequest,
    "unknown-field": InvalidRequest,
    "unsupported-media-type": InvalidRequest,
    "body-too-large": PayloadTooLarge,
    "invalid-field": InvalidRequest,
    "batch-too-large": InvalidRequest,
    "invalid-parameter": InvalidRequest,
    "invalid-id": InvalidRequest,
    "not-found": NotFound,
    "method-not-allowed": MethodNotAllowed,
    "idempotency-key-reused": Conflict,
    "budget-exhausted": BudgetExhausted,
    "egress-not-allowed": EgressNotAllowed,
    "unauthorized": Unauthorized,
    "queue-full": QueueFull,
    "rate-limited": RateLimited,
    "unavailable": Unavailable,
    "internal": ServerError,
}

_BY_STATUS = {
    400: InvalidRequest, 401: Unauthorized, 403: Unauthorized, 404: NotFound, 405: MethodNotAllowed,
    409: Conflict, 413: PayloadTooLarge, 415: InvalidRequest, 422: InvalidRequest, 429: RateLimited,
    503: Unavailable,
}


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
