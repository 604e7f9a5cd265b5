"""Side-by-side benchmarks of TRACE components against peers (see README.md)."""
