"""The tiny test world's own guards (tests/unit/inference/tiny.py): `check_world` rejects a world
that did not learn the fixed reply, and the cache key changes with any source file the world
can depend on."""

from __future__ import annotations

import shutil

import pytest

from tests.unit.inference import tiny


def test_check_world_accepts_the_world_the_tests_use(world):
    assert tiny.check_world(world) >= tiny.MIN_MARGIN


def test_check_world_rejects_an_untrained_world_and_says_what_it_did_not_learn(tmp_path):
    untrained = tiny.build_world(tmp_path, steps=0)
    with pytest.raises(AssertionError, match="did not learn to answer every probe prompt") as exc:
        tiny.check_world(untrained)
    message = str(exc.value)
    assert tiny.FIXED_REPLY in message and "base, refunds prompt seed 0" in message
    assert f"{2 * 3 * len(tiny.PROBE_SEEDS)} of {3 * 2 * len(tiny.PROBE_SEEDS)} probes failed" in message


@pytest.fixture
def fake_repo(tmp_path, monkeypatch):
    """A copy of the trees the key covers (small files only), as tiny.REPO."""
    for tree, name in (("trace_common", "agents/tokenizer.py"), ("services", "inference/engine.py")):
        path = tmp_path / tree / name
        path.parent.mkdir(parents=True)
        shutil.copy(tiny.REPO / tree / "__init__.py", path)
    monkeypatch.setattr(tiny, "REPO", tmp_path)
    return tmp_path


@pytest.mark.parametrize(("change", "same_key"), [
    (lambda root: None, True),
    (lambda root: (root / "trace_common/agents/tokenizer.py").write_text("# changed merges\n"), False),
    (lambda root: (root / "services/inference/engine.py").write_text("# changed\n"), False),
    (lambda root: (root / "trace_common/policy").mkdir() or (root / "trace_common/policy/chat.py").write_text("x"),
     False),  # a new file
    (lambda root: (root / "trace_common/agents/__pycache__").mkdir()
     or (root / "trace_common/agents/__pycache__/tokenizer.cpython-311.pyc").write_bytes(b"\0"), True),
], ids=["unchanged", "trace_common-file", "services-file", "new-file", "bytecode-only"])
def test_cache_key_covers_every_source_file(fake_repo, change, same_key):
    before = tiny.world_cache_key()
    change(fake_repo)
    assert (tiny.world_cache_key() == before) is same_key
