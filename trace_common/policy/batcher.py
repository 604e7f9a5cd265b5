"""Collect concurrent requests into batches for a synchronous batch function.

Episodes played at the same time each ask for one reply per turn. A model forward pass on
32 conversations costs little more than on one, so the in-process backend answers them
together: the batcher waits up to `max_wait_s` after the first request for more (up to
`max_batch`), then runs the batch function on one dedicated worker thread (the model is
never used from two threads at once, and the asyncio loop stays free meanwhile).
While a batch runs, new requests queue up and form the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from trace_common.errors import FailedPrecondition, InvalidArgument

T = TypeVar("T")
R = TypeVar("R")


@dataclass
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
    """

    def __init__(self, fn: Callable[[list[T]], list[R]], *, max_batch: int = 32, max_wait_s: float = 0.005,
                 thread_name: str = "policy-batch"):
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

    def _ensure_started(self) -> asyncio.Queue[_Item[T, R]]:
        if self._closed:
            raise FailedPrecondition("the policy was closed; create a new one")
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
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
                results = await loop.run_in_executor(self._executor, self.fn, [i.payload for i in live])
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

    async def close(self) -> None:
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
        self._executor.shutdown(wait=False, cancel_futures=True)
