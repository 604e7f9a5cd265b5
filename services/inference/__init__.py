"""Inference service: base + adapters + gates with token-level top-1 routing."""
