"""Shared pytest setup: fixtures for real servers live in tests/support/ and are registered here."""

import os

pytest_plugins = ["tests.support.s3", "tests.support.prom", "tests.support.stack", "tests.support.vllm"]

# Tests must never reach a model hub (there is none here, and CI must not depend on one).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
