"""The Dockerfiles: hadolint-clean, and the properties the chart relies on.

Images cannot be built here (no Docker engine), so these are static checks: pinned bases
(CUDA runtime for the GPU images, slim Python 3.11 for the others), multi-stage with nothing but
COPY and user creation in the final stage, a numeric non-root USER (the chart's runAsNonRoot),
and the exec-form CMD the chart's Deployments also spell out.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.chart.helm import REPO, VENV_BIN, require_tool

IMAGES = {
    "rollout": ("slim", "services.rollout"),
    "analysis": ("slim", "services.analysis"),
    "environment": ("slim", "services.environment"),
    "trainer": ("cuda", "services.trainer"),
    "inference": ("cuda", "services.inference"),
    "sandbox": ("slim", "services.environment.sandbox.worker"),
}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(text):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_hadolint_clean(name):
    exe = require_tool(VENV_BIN / "hadolint")
    proc = subprocess.run([str(exe), "--no-color", "--failure-threshold", "info", str(REPO / f"Dockerfile.{name}")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_dockerfile_shape(name):
    base_kind, module = IMAGES[name]
    text = (REPO / f"Dockerfile.{name}").read_text()
    st = stages(text)
    assert len(st) >= 2, "multi-stage build expected"
    for stage in st:
        image = stage[0][1].split()[0]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"unpinned base {image}"
    final = st[-1]
    final_base = final[0][1].split()[0]
    if base_kind == "cuda":
        assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-runtime-ubuntu\d+\.\d+", final_base), final_base
    else:
        assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", final_base), final_base
    assert "HEALTHCHECK" in text  # the comment explaining why there is none (Kubernetes gRPC probes)
    assert not any(i == "HEALTHCHECK" for i, _ in instructions(text))
    # The final stage only copies build results in and creates the user: no compilers, no installs.
    for ins, args in final[1:]:
        assert ins in {"COPY", "ENV", "WORKDIR", "USER", "EXPOSE", "CMD", "RUN", "LABEL", "ARG"}, ins
        if ins == "RUN":
            assert re.fullmatch(r"groupadd [^&]+&& useradd [^&]+", args), f"final-stage RUN does more: {args}"
        if ins == "COPY":
            assert args.startswith("--from="), f"final stage copies from the context: {args}"
    assert re.search(r"\b(apt-get|apk|gcc|build-essential|pip |uv )", " ".join(a for i, a in final[1:] if i == "RUN")) is None
    users = [a for i, a in final if i == "USER"]
    assert users and re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", users[-1]), users
    (cmd,) = [a for i, a in final if i == "CMD"]
    assert json.loads(cmd) == ["python", "-m", module]
    # torch build chosen by a build arg (CPU by default on slim, CUDA on the GPU images).
    arg = re.search(r"^ARG TORCH_INDEX_URL=(\S+)$", text, re.M)
    assert arg and arg.group(1).endswith("/cpu" if base_kind == "slim" else "/cu128")


def test_dockerignore_keeps_only_what_the_builds_need():
    lines = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*", "exclude everything, then re-include"
    included = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    for needed in ("pyproject.toml", "trace_common", "services", "tracectl", "prompts", "README.md"):
        assert needed in included, needed
        assert (REPO / needed).exists(), f"{needed} is re-included but missing from the repo"
    assert not included & {".venv", ".git", ".tools", "tests", "bench", "charts"}
