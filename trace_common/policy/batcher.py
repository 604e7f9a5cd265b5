"""Collect concurrent requests into batches for a synchronous batch function.

Episodes played at the same time each ask for one reply per turn. A model forward pass on
32 conversations costs little more than on one, so the in-process backend answers them
together: the batcher waits up to `max_wait_s` after the first request for more (up to
`max_batch`), then runs the batch function on one dedicated worker thread (the model is
never used from two threads at once, and the asyncio loop stays free meanwhile).
While a batch runs, new requests queue up and form the next batch.

Closing answers every request still waiting -- queued, being gathered, or in the batch that runs --
with the close's error at once (a caller must never wait on a batcher that will not answer), tells
`on_abandon` about each of them (so the batch function can stop working on a running one), and with
`wait=True` returns only once the worker thread has left the running batch (so the caller may then
free what the batch function uses).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from trace_common.errors import FailedPrecondition, InvalidArgument, TraceError, Unavailable

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)   # hashed by identity: kept in the batcher's set of unanswered requests
class _Item(Generic[T, R]):
    payload: T
    future: asyncio.Future[R]


class RequestBatcher(Generic[T, R]):
    """`await batcher.submit_many(items)` -> results, computed by `fn(list_of_items)` in
    batches of at most `max_batch` items gathered across concurrent callers.

    `fn` must return one result per item, in order. An exception from `fn` fails every
    request of that batch with that exception. `batch_sizes` records each batch's size.
    The batcher binds to the event loop of its first use; using it from another loop
    later (e.g. a new `asyncio.run`) starts a fresh collector on that loop.
    `on_abandon(payload)` is called (on the event loop) for every request that `close` answers
    before `fn` did, e.g. to flag a running row so that `fn` stops decoding it.
    """

    def __init__(self, fn: Callable[[list[T]], list[R]], *, max_batch: int = 32, max_wait_s: float = 0.005,
                 thread_name: str = "policy-batch", on_abandon: Callable[[T], None] | None = None):
        if max_batch < 1:
            raise InvalidArgument(field="max_batch", expected="an integer >= 1", got=max_batch)
        if max_wait_s < 0:
            raise InvalidArgument(field="max_wait_s", expected="seconds >= 0", got=max_wait_s)
        self.fn = fn
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.batch_sizes: list[int] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Item[T, R]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._closed_error: TraceError = FailedPrecondition("the policy was closed; create a new one")
        self.on_abandon = on_abandon
        #: every request not answered yet, wherever it is (queue, batch being gathered, running batch)
        self._pending: set[_Item[T, R]] = set()
        #: the worker's current batch (done once the worker thread has left it)
        self._worker: concurrent.futures.Future[list[R]] | None = None

    def _ensure_started(self) -> asyncio.Queue[_Item[T, R]]:
        if self._closed:
            raise self._closed_error
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            if self._loop is not loop:
                self._pending.clear()   # futures of a former loop: nobody on this loop awaits them
            self._loop = loop
            self._queue = asyncio.Queue()
            self._task = loop.create_task(self._collect(self._queue), name="policy-batcher")
        assert self._queue is not None
        return self._queue

    async def submit_many(self, payloads: Sequence[T]) -> list[R]:
        queue = self._ensure_started()
        loop = asyncio.get_running_loop()
        items = [_Item(p, loop.create_future()) for p in payloads]
        for item in items:
            self._pending.add(item)
            item.future.add_done_callback(lambda _f, item=item: self._pending.discard(item))
            queue.put_nowait(item)
        return list(await asyncio.gather(*(i.future for i in items)))

    async def _collect(self, queue: asyncio.Queue[_Item[T, R]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            deadline = loop.time() + self.max_wait_s
            while len(batch) < self.max_batch:
                try:
                    batch.append(queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), remaining))
                except TimeoutError:
                    break
            live = [i for i in batch if not i.future.done()]
            if not live:
                continue
            self.batch_sizes.append(len(live))
            try:
                self._worker = self._executor.submit(self.fn, [i.payload for i in live])
                results = await asyncio.wrap_future(self._worker)
            except Exception as exc:  # noqa: BLE001 - delivered to every waiting caller
                for item in live:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            if len(results) != len(live):
                err = FailedPrecondition(f"batch function returned {len(results)} results for {len(live)} requests")
                for item in live:
                    if not item.future.done():
                        item.future.set_exception(err)
                continue
            for item, result in zip(live, results, strict=True):
                if not item.future.done():
                    item.future.set_result(result)

    async def close(self, error: TraceError | None = None, *, wait: bool = False) -> None:
        """Stop: answer every unanswered request with `error` (Unavailable without one), refuse later
        submits with it (FailedPrecondition "closed; create a new one" without one), stop the collector.
        With `wait`, return once the worker thread has left the running batch (`fn` keeps running until
        it returns: it must watch what `on_abandon` flags to stop early)."""
        self._closed = True
        if error is not None:
            self._closed_error = error
        failure = error or Unavailable("the batcher was closed before this request was answered; retry")
        abandoned = [item for item in self._pending if not item.future.done()]
        self._pending.clear()
        for item in abandoned:
            if self.on_abandon is not None:
                self.on_abandon(item.payload)
            item.future.set_exception(failure)
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
        if wait:
            await self._worker_left()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _worker_left(self) -> None:
        """Return once the worker's current batch has ended (its outcome is nobody's any more)."""
        worker = self._worker
        if worker is None or worker.done():
            return
        done = asyncio.wrap_future(worker)
        await asyncio.wait([done])
        if not done.cancelled():
            done.exception()   # retrieved: an abandoned batch's failure is not an unhandled error
