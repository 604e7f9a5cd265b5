"""The model roots of services tracectl starts itself (tracectl/embedded.py): its operator's
TRACE_<SERVICE>_MODEL_ROOTS, the working directory, the built-in agent cache, and the local model
directories a command names; nothing for built-in names, served model names or s3:// URIs."""

from __future__ import annotations

import argparse

import pytest

from trace_common.agents.cache import default_cache_dir
from tracectl.embedded import EMBEDDED_MODEL_ROOTS, allow_models_from_command, local_model_roots, model_dirs


@pytest.mark.parametrize("cwd", [True, False])  # False: `tracectl up` and `serve`, long-lived servers
def test_local_roots_are_the_operators_then_the_working_directory_and_the_agent_cache(tmp_path, monkeypatch, cwd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRACE_ROLLOUT_MODEL_ROOTS", "/srv/models,s3://models/base")
    extra = tmp_path / "mine"
    assert local_model_roots("rollout", [extra], cwd=cwd) == [
        "file:///srv/models", "s3://models/base", *([tmp_path.resolve().as_uri()] if cwd else []),
        default_cache_dir().expanduser().resolve().as_uri(), extra.resolve().as_uri()]


def test_an_agent_cache_setting_that_is_a_file_adds_no_root(tmp_path, monkeypatch):
    """A stack still starts (its jobs may need no built-in agent); one that does fails, naming the variable."""
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("TRACE_AGENT_CACHE", str(tmp_path / "afile"))
    monkeypatch.delenv("TRACE_ROLLOUT_MODEL_ROOTS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert local_model_roots("rollout") == [tmp_path.resolve().as_uri()]


@pytest.mark.parametrize("cwd_model_root", [True, False])
def test_a_stack_lists_the_working_directory_only_when_asked(tmp_path, monkeypatch, cwd_model_root):
    """`tracectl up` starts its stack with cwd_model_root=False: started from HOME, it would otherwise
    load any model under HOME for every token holder (and answer which paths hold a config.json)."""
    import asyncio

    from tracectl.embedded import EmbeddedStack

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACE_ROLLOUT_MODEL_ROOTS", raising=False)

    async def roots() -> list[str]:
        stack = EmbeddedStack(root=tmp_path / "store", cwd_model_root=cwd_model_root)
        await stack.start()
        try:
            return list(stack.servers["rollout"].settings.model_roots)
        finally:
            await stack.stop()

    assert (tmp_path.resolve().as_uri() in asyncio.run(roots())) is cwd_model_root


@pytest.mark.parametrize(("ref", "expected"), [
    ("micro", None),                                   # a built-in agent: resolved by name
    ("expert:perfect", None),                          # a scripted policy's name
    ("s3://bucket/m", None),                           # in a store, not on this machine
    ("", None),
    ("{tmp}/model", "{tmp}/model"),                    # a directory
    ("file://{tmp}/model", "{tmp}/model"),
    ("{tmp}/model/adapter_config.json", "{tmp}/model"),  # a file: its directory
    ("{tmp}/not-yet", "{tmp}/not-yet"),                # named, not there: the service says it is missing
])
def test_model_dirs_are_the_local_directories_a_command_names(tmp_path, ref, expected):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "adapter_config.json").write_text("{}")
    got = model_dirs(ref.format(tmp=tmp_path))
    assert got == ([] if expected is None else [tmp_path.__class__(expected.format(tmp=tmp_path))])


def test_a_command_adds_its_directories_to_the_overrides(tmp_path):
    args = argparse.Namespace(overrides={"max_message_bytes": 1 << 20})
    allow_models_from_command(args, "micro", "")
    assert EMBEDDED_MODEL_ROOTS not in args.overrides       # nothing local: nothing listed
    allow_models_from_command(args, str(tmp_path), "s3://b/a")
    allow_models_from_command(args, str(tmp_path / "other"))
    assert args.overrides == {"max_message_bytes": 1 << 20, EMBEDDED_MODEL_ROOTS: [tmp_path, tmp_path / "other"]}
