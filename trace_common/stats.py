"""Small statistics shared by reports: pass rates with confidence intervals."""

from __future__ import annotations

import math


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion (well-behaved at 0 and n).

    Semantics:
        p = s/n; d = 1 + z²/n
        centre = (p + z²/2n) / d ; half = z·sqrt(p(1-p)/n + z²/4n²) / d
        -> (max(0, centre-half), min(1, centre+half)); (0, 1) when n == 0
    """
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} must be within [0, n={n}]")
    p = successes / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)
