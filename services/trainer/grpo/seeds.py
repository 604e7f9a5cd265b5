"""The seed schedule: which environment instances each iteration trains on.

A seeded permutation of the training split, read with a cursor (the number of seeds drawn
so far), so the schedule is a pure function of (split, seed, cursor): a resumed job that
restores the cursor draws exactly the seeds the uninterrupted job would have. The
permutation is affine (i -> (a*i + b) mod n with gcd(a, n) = 1), O(1) memory even for
splits of millions of seeds; after n draws it starts over with a new (a, b).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from trace_common.errors import FailedPrecondition


class SeedSchedule:
    def __init__(self, split: Sequence[int], seed: int):
        if len(split) == 0:
            raise FailedPrecondition("the training split has no seeds; pick a split the environment defines")
        self.split = split
        self.seed = seed
        self._cache: dict[int, tuple[int, int]] = {}

    def _affine(self, epoch: int) -> tuple[int, int]:
        if epoch not in self._cache:
            n = len(self.split)
            rng = random.Random(f"{self.seed}:{epoch}:{n}")
            a = rng.randrange(1, n) if n > 1 else 1
            while math.gcd(a, n) != 1:
                a = rng.randrange(1, n)
            self._cache[epoch] = (a, rng.randrange(n))
        return self._cache[epoch]

    def at(self, cursor: int) -> int:
        """The seed at position `cursor` of the schedule."""
        n = len(self.split)
        epoch, i = divmod(cursor, n)
        a, b = self._affine(epoch)
        return int(self.split[(a * i + b) % n])

    def take(self, cursor: int, count: int) -> list[int]:
        return [self.at(cursor + k) for k in range(count)]
