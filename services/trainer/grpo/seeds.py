"""The seed schedule: which environment instances each iteration trains on.

A seeded permutation of the training split, read with a cursor (the number of seeds drawn
so far), so the schedule is a pure function of (split, seed, cursor): a resumed job that
restores the cursor draws exactly the seeds the uninterrupted job would have. The
permutation is affine (i -> (a*i + b) mod n with gcd(a, n) = 1), O(1) memory even for
splits of millions of seeds; after n draws it starts over with a new (a, b).

Seeds in `exclude` (the calibration seeds whose episodes were the first batches,
initial_batches.py) are never drawn: the cursor counts the remaining seeds only, so an epoch
has n - |exclude in split| draws. Each epoch's permutation is the same as without exclusions,
with the excluded seeds' positions skipped.

Semantics (n = len(split), E = the excluded seeds' split indices, m = n - |E|):
    epoch, i = divmod(cursor, m); a, b = affine(epoch)
    skipped = sorted(a^-1 * (x - b) mod n for x in E)      # their positions in this epoch
    j = i; for p in skipped: if p <= j: j += 1             # the i-th position not skipped
    at(cursor) = split[(a * j + b) mod n]
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Sequence

from trace_common.errors import FailedPrecondition


class SeedSchedule:
    def __init__(self, split: Sequence[int], seed: int, exclude: Collection[int] = ()):
        if len(split) == 0:
            raise FailedPrecondition("the training split has no seeds; pick a split the environment defines")
        self.split = split
        self.seed = seed
        self._cache: dict[int, tuple[int, int]] = {}
        members = split if isinstance(split, range) else set(split)
        self._excluded = sorted({split.index(s) for s in exclude if s in members})   # split indices
        if len(self._excluded) == len(split):
            raise FailedPrecondition(f"every seed of the training split ({len(split)}) was excluded (used as initial "
                                     "batches); nothing is left to train on: use a larger split")
        self._skipped: dict[int, list[int]] = {}

    def _affine(self, epoch: int) -> tuple[int, int]:
        if epoch not in self._cache:
            n = len(self.split)
            rng = random.Random(f"{self.seed}:{epoch}:{n}")
            a = rng.randrange(1, n) if n > 1 else 1
            while math.gcd(a, n) != 1:
                a = rng.randrange(1, n)
            self._cache[epoch] = (a, rng.randrange(n))
        return self._cache[epoch]

    def _positions(self, epoch: int, a: int, b: int) -> list[int]:
        if epoch not in self._skipped:
            n = len(self.split)
            inverse = pow(a, -1, n) if n > 1 else 0
            self._skipped[epoch] = sorted(inverse * (x - b) % n for x in self._excluded)
        return self._skipped[epoch]

    def at(self, cursor: int) -> int:
        """The seed at position `cursor` of the schedule."""
        n = len(self.split)
        epoch, j = divmod(cursor, n - len(self._excluded))
        a, b = self._affine(epoch)
        for p in self._positions(epoch, a, b) if self._excluded else ():
            if p <= j:
                j += 1
        return int(self.split[(a * j + b) % n])

    def take(self, cursor: int, count: int) -> list[int]:
        return [self.at(cursor + k) for k in range(count)]
