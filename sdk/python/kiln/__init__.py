"""Kiln: run untrusted code in sandboxes from Python.

    import kiln
    client = kiln.Client()            # $KILN_SERVER, $KILN_API_KEY
    res = client.run("print(6*7)")
    print(res.status, res.stdout)

Standard library only; Python 3.9 or newer.
"""
from ._transport import NO_RETRY, RetryPolicy
from .aio import AsyncClient, AsyncSession
from .client import Client
from .errors import (BudgetExhausted, Conflict, DecodeError, EgressNotAllowed, ConnectionFailed, FileConflict, IntegrityError, InvalidRequest, KilnError, MethodNotAllowed,
                     NotFound, PayloadTooLarge, QueueFull, QuotaExceeded, RateLimited, ReplayUnavailable, ResponseTooLarge,
                     ServerError, SessionEnded, Unauthorized, Unavailable, WaitTimeout)
from .types import (Artifact, BatchItem, Event, Failure, File, Image, JobPage, JobSummary, Limits, Result, Spec,
                    TERMINAL_STATUSES)
from .sessions import CallResult, FileInfo, Session
from . import tools

__version__ = "0.1.0"

__all__ = [
    "Client", "AsyncClient", "RetryPolicy", "NO_RETRY",
    "Spec", "Limits", "File", "Result", "Failure", "Artifact", "Image", "BatchItem", "Event", "JobSummary", "JobPage",
    "TERMINAL_STATUSES",
    "KilnError", "BudgetExhausted", "EgressNotAllowed", "InvalidRequest", "PayloadTooLarge", "Unauthorized", "NotFound", "MethodNotAllowed", "Conflict",
    "RateLimited", "QueueFull", "QuotaExceeded", "ResponseTooLarge", "ReplayUnavailable", "SessionEnded", "FileConflict", "Unavailable",
    "ServerError", "ConnectionFailed", "WaitTimeout", "IntegrityError", "DecodeError",
    "Session", "AsyncSession", "CallResult", "FileInfo", "tools",
]
