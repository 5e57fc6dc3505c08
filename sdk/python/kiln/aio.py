"""The asyncio Kiln client.

Each call runs the synchronous client's call on a worker thread
(asyncio.to_thread): the standard library has no asyncio HTTP client, and
urllib already handles HTTP/1.1, chunked bodies, TLS and proxies correctly.
One thread per call in flight is cheap at the concurrency an agent runs;
cancelling the awaiting task stops waiting at once, while the thread ends
with its request (at most one long-poll period later).
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Union

from .client import Client, SpecLike
from ._transport import RetryPolicy
from .sessions import CallResult, FileInfo, Session
from .types import Artifact, BatchItem, Event, JobPage, Result

_END = object()


class AsyncClient:
    """The asyncio twin of Client: the same methods, awaited."""

    def __init__(self, server: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: float = 30.0, retry: Optional[RetryPolicy] = None, long_poll: float = 30.0) -> None:
        self.sync = Client(server, api_key, timeout=timeout, retry=retry, long_poll=long_poll)

    @property
    def server(self) -> str:
        return self.sync.server

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    async def submit(self, code_or_spec: SpecLike, *, wait: Optional[float] = None,
                     idempotency_key: Optional[str] = None, **spec: Any) -> Result:
        return await asyncio.to_thread(self.sync.submit, code_or_spec, wait=wait,
                                       idempotency_key=idempotency_key, **spec)

    async def get(self, job_id: str, wait: Optional[float] = None) -> Result:
        return await asyncio.to_thread(self.sync.get, job_id, wait)

    async def wait(self, job_id: str, timeout: Optional[float] = None) -> Result:
        return await asyncio.to_thread(self.sync.wait, job_id, timeout)

    async def run(self, code_or_spec: SpecLike, *, timeout: Optional[float] = None, **spec: Any) -> Result:
        return await asyncio.to_thread(self.sync.run, code_or_spec, timeout=timeout, **spec)

    async def cancel(self, job_id: str) -> Result:
        return await asyncio.to_thread(self.sync.cancel, job_id)

    async def batch(self, specs: Sequence[SpecLike]) -> List[BatchItem]:
        return await asyncio.to_thread(self.sync.batch, specs)

    async def jobs(self, ids: Sequence[str]) -> List[Optional[Result]]:
        return await asyncio.to_thread(self.sync.jobs, ids)

    async def wait_all(self, ids: Sequence[str], timeout: Optional[float] = None) -> List[Result]:
        return await asyncio.to_thread(self.sync.wait_all, ids, timeout)

    async def runtimes(self) -> List[Dict[str, Any]]:
        return await asyncio.to_thread(self.sync.runtimes)

    async def artifact(self, job_id: str, artifact: Union[str, Artifact], path: Any = None) -> Any:
        return await asyncio.to_thread(self.sync.artifact, job_id, artifact, path)

    async def run_tool_call(self, call: Mapping[str, Any], *, timeout: Optional[float] = None,
                            runtime: Optional[str] = None, budget: Optional[str] = None) -> Dict[str, Any]:
        return await asyncio.to_thread(self.sync.run_tool_call, call, timeout=timeout, runtime=runtime, budget=budget)

    async def list_jobs(self, **filters: Any) -> JobPage:
        return await asyncio.to_thread(self.sync.list_jobs, **filters)

    async def replay(self, job_id: str) -> Result:
        return await asyncio.to_thread(self.sync.replay, job_id)

    async def audit(self, **query: Any) -> List[Dict[str, Any]]:
        return await asyncio.to_thread(self.sync.audit, **query)

    async def create_budget(self, **limits: Any) -> Dict[str, Any]:
        return await asyncio.to_thread(self.sync.create_budget, **limits)

    async def get_budget(self, budget_id: str) -> Dict[str, Any]:
        return await asyncio.to_thread(self.sync.get_budget, budget_id)

    # --- sessions ---------------------------------------------------------

    async def session(self, *, runtime: Optional[str] = None, **spec: Any) -> "AsyncSession":
        """Create a session (see Client.session); ``async with`` it, or ``await s.close()``."""
        return AsyncSession(await asyncio.to_thread(self.sync.session, runtime=runtime, **spec))

    async def get_session(self, session_id: str) -> "AsyncSession":
        return AsyncSession(await asyncio.to_thread(self.sync.get_session, session_id))

    async def sessions(self, *, tags: Optional[Mapping[str, str]] = None) -> List["AsyncSession"]:
        return [AsyncSession(s) for s in await asyncio.to_thread(self.sync.sessions, tags=tags)]

    async def events(self, job_id: str, *, last_event_id: Optional[str] = None,
                     timeout: Optional[float] = None) -> AsyncIterator[Event]:
        """``async for ev in client.events(job_id)``: the live events, resumed across reconnects."""
        it = self.sync.events(job_id, last_event_id=last_event_id, timeout=timeout)
        try:
            while True:
                ev = await asyncio.to_thread(next, it, _END)
                if ev is _END:
                    return
                yield ev  # type: ignore[misc]
        finally:
            it.close()


class AsyncSession:
    """The asyncio twin of Session: the same methods, awaited; ``sync`` is the Session."""

    def __init__(self, sync: Session) -> None:
        self.sync = sync

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sync, name)  # id, status, runtime, incarnation, metadata, paused_at, restored, raw

    def __repr__(self) -> str:
        return f"AsyncSession({self.sync!r})"

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def run(self, code: str, *, timeout: Optional[float] = None, **call: Any) -> CallResult:
        return await asyncio.to_thread(self.sync.run, code, timeout=timeout, **call)

    async def cancel_call(self, seq: int) -> CallResult:
        return await asyncio.to_thread(self.sync.cancel_call, seq)

    async def command(self, cmd: str, *, timeout: Optional[int] = None, background: bool = False,
                      env: Optional[Mapping[str, str]] = None, stdin: bool = False) -> CallResult:
        return await asyncio.to_thread(self.sync.command, cmd, timeout=timeout, background=background, env=env,
                                       stdin=stdin)

    async def wait_command(self, command_id: str, wait: float = 0) -> CallResult:
        return await asyncio.to_thread(self.sync.wait_command, command_id, wait)

    async def kill_command(self, command_id: str) -> CallResult:
        return await asyncio.to_thread(self.sync.kill_command, command_id)

    async def write_stdin(self, command_id: str, data: str = "", close: bool = False) -> CallResult:
        return await asyncio.to_thread(self.sync.write_stdin, command_id, data, close)

    async def list_commands(self) -> List[Dict[str, Any]]:
        return await asyncio.to_thread(self.sync.list_commands)

    async def read_file(self, name: str) -> bytes:
        return await asyncio.to_thread(self.sync.read_file, name)

    async def write_file(self, name: str, data: Union[bytes, str]) -> FileInfo:
        return await asyncio.to_thread(self.sync.write_file, name, data)

    async def upload(self, local: Any, name: Optional[str] = None) -> FileInfo:
        return await asyncio.to_thread(self.sync.upload, local, name)

    async def download(self, name: str, local: Any = None) -> str:
        return await asyncio.to_thread(self.sync.download, name, local)

    async def list_files(self, path: str = "", *, recursive: bool = False) -> List[FileInfo]:
        return await asyncio.to_thread(self.sync.list_files, path, recursive=recursive)

    async def stat(self, name: str) -> FileInfo:
        return await asyncio.to_thread(self.sync.stat, name)

    async def exists(self, name: str) -> bool:
        return await asyncio.to_thread(self.sync.exists, name)

    async def remove(self, name: str, *, recursive: bool = False) -> None:
        await asyncio.to_thread(self.sync.remove, name, recursive=recursive)

    async def mkdir(self, name: str) -> FileInfo:
        return await asyncio.to_thread(self.sync.mkdir, name)

    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> FileInfo:
        return await asyncio.to_thread(self.sync.move, src, dst, overwrite=overwrite)

    async def pause(self, *, timeout: Optional[float] = None) -> "AsyncSession":
        await asyncio.to_thread(self.sync.pause, timeout=timeout)
        return self

    async def resume(self) -> "AsyncSession":
        await asyncio.to_thread(self.sync.resume)
        return self

    async def refresh(self) -> "AsyncSession":
        await asyncio.to_thread(self.sync.refresh)
        return self

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)
