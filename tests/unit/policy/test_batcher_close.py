"""RequestBatcher.close (trace_common/policy/batcher.py): every request still waiting -- in the running batch,
queued behind it, or submitted afterwards -- is answered at once with the close's error; `on_abandon` hears
of each one; with `wait=True` close returns only after the worker thread has left the running batch.
Before, close cancelled the collector and left those callers waiting for ever."""

from __future__ import annotations

import asyncio
import threading

import pytest

from trace_common.errors import FailedPrecondition, Unavailable
from trace_common.policy.batcher import RequestBatcher


class Gate:
    """A batch function that holds its first batch until every payload in it is abandoned (as a decoding
    loop stops rows flagged cancelled), or until `release` -- and records whether it is inside a batch."""

    def __init__(self):
        self.inside = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.abandoned: set[int] = set()
        self.batches: list[list[int]] = []

    def fn(self, payloads: list[int]) -> list[int]:
        self.inside.set()
        self.entered.set()
        self.batches.append(list(payloads))
        try:
            while not self.release.is_set() and not set(payloads) <= self.abandoned:
                self.release.wait(0.01)
            return [p * 10 for p in payloads]
        finally:
            self.inside.clear()

    def abandon(self, payload: int) -> None:
        self.abandoned.add(payload)


async def _running(gate: Gate, batcher: RequestBatcher[int, int]):
    """Two requests in the running batch and one queued behind it."""
    running = [asyncio.ensure_future(batcher.submit_many([p])) for p in (1, 2)]
    await asyncio.to_thread(gate.entered.wait, 10)
    queued = asyncio.ensure_future(batcher.submit_many([3]))
    await asyncio.sleep(0.05)
    return running, queued


@pytest.mark.parametrize("error, expected", [
    (Unavailable("composition 'm' was unloaded; retry"), Unavailable),
    (None, Unavailable),                             # no error given: still answered, as UNAVAILABLE
])
def test_close_answers_running_and_queued_requests_and_waits_for_the_worker(error, expected):
    gate = Gate()

    async def main():
        batcher = RequestBatcher(gate.fn, max_batch=4, max_wait_s=0.02, on_abandon=gate.abandon)
        running, queued = await _running(gate, batcher)
        await asyncio.wait_for(batcher.close(error, wait=True), 10)
        inside_after_close = gate.inside.is_set()
        outcomes = await asyncio.wait_for(asyncio.gather(*running, queued, return_exceptions=True), 5)
        with pytest.raises(expected if error is not None else FailedPrecondition):
            await batcher.submit_many([4])           # after close: the close's error (or "closed; create a new one")
        return inside_after_close, outcomes

    inside_after_close, outcomes = asyncio.run(main())
    assert all(isinstance(o, expected) for o in outcomes), outcomes
    if error is not None:
        assert all(o is error for o in outcomes)
    assert gate.abandoned == {1, 2, 3} and not inside_after_close
    assert gate.batches == [[1, 2]]                 # the queued request never reached the worker


def test_close_without_wait_returns_while_the_worker_is_still_inside():
    """The rollout policy's close: callers answered at once, the batch function left to finish on its own."""
    gate = Gate()

    async def main():
        batcher = RequestBatcher(gate.fn, max_batch=4, max_wait_s=0.02)   # no on_abandon: nothing stops fn
        running, queued = await _running(gate, batcher)
        await asyncio.wait_for(batcher.close(), 10)
        inside = gate.inside.is_set()
        gate.release.set()
        return inside, await asyncio.wait_for(asyncio.gather(*running, queued, return_exceptions=True), 5)

    inside, outcomes = asyncio.run(main())
    assert inside and all(isinstance(o, Unavailable) for o in outcomes), outcomes


def test_a_batch_that_ends_normally_is_delivered():
    gate = Gate()
    gate.release.set()

    async def main():
        batcher = RequestBatcher(gate.fn, max_batch=4, max_wait_s=0.05)
        results = await asyncio.gather(batcher.submit_many([1]), batcher.submit_many([2, 3]))
        await batcher.close(wait=True)
        return results

    assert asyncio.run(main()) == [[10], [20, 30]]
