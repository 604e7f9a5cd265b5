import pytest

from trace_common.stats import wilson_interval


@pytest.mark.parametrize(("s", "n", "lo", "hi"), [
    (0, 0, 0.0, 1.0),
    (0, 10, 0.0, 0.2775),
    (10, 10, 0.7225, 1.0),
    (5, 10, 0.2366, 0.7634),
    (79, 200, 0.3295, 0.4643),
])
def test_wilson_matches_reference_values(s, n, lo, hi):
    got = wilson_interval(s, n)
    assert got == pytest.approx((lo, hi), abs=5e-4)


def test_wilson_rejects_impossible_counts():
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
