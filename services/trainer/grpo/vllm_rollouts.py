"""Training rollouts from a vLLM server with runtime LoRA updating.

Each new policy version is saved as a PEFT adapter into a directory the server can read
(`adapter_dir/<cap>-<lineage>-v<N>`), loaded under that immutable name (`POST /v1/load_lora_adapter`),
verified (the name is listed by `GET /v1/models`), and only then made current; the
previous version is unloaded (`POST /v1/unload_lora_adapter`) at once when no request runs on
it (so after `publish` exactly one version is served), else once the requests that started on
it have finished -- or after `drain_timeout_s`, so a stuck request cannot pin it forever.
Every HTTP call has a deadline; loads are retried with exponential backoff (vLLM answers 500
when its worker cannot read or apply the files, 404 "No adapter found" when it cannot see the
path) and a version that cannot be loaded fails the job with the server's reason
(`Unavailable`), never a hang. A name the server already serves but this manager never loaded
(left by an earlier attempt on the same checkpoints: a resumed job numbers its versions again) is
unloaded and loaded again from our files. `<lineage>` is a digest of the job's checkpoint prefix
(runs/<run>/adapters/<capability>): a retried pod or a new job resuming the same checkpoints serves
under the same names and replaces its leftovers, while jobs of other runs that train the same
capability on one server never replace, serve or delete each other's versions. The server must run with `--enable-lora --max-loras >= 2` (old and new version are
resident together during a switch) and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; start it with
`--logprobs-mode processed_logprobs` so reported logprobs are those of the sampling
distribution (used as behaviour logprobs for guided tokens).

A data-parallel job (torchrun, `distributed.py`) publishes each version once: rank 0 saves, loads,
verifies and unloads as above; every other rank waits at a barrier until rank 0 has, then samples
from that name too (after checking that the server lists it), and never loads, unloads or deletes a
version itself (N ranks loading one name would replace each other's loads mid-rollout).

Generation uses `/v1/completions` with the prompt as token ids rendered by our own chat
format (the same ids the trainer scores) and `return_tokens_as_token_ids`, so completion
token ids and logprobs come back exactly, with no re-tokenisation of text.

Replies get the room left in the server's context (max_model_len from /v1/models), and a prompt
that leaves none raises ContextExhausted (the episode ends, as with the in-process backend).

Semantics (publish(N); on rank 0 of a data-parallel job, the other ranks as below):
    save adapter -> dir/<cap>-<lineage>-vN
    repeat up to 1 + load_retries: load(<cap>-<lineage>-vN); if listed in /v1/models: break; sleep(backoff * 2^k)
        (a first "already loaded" for a name not loaded by us: unload it, load again)
    current := <cap>-<lineage>-vN; unload(previous) now if refcount(previous) == 0, else when it drops to 0
    (or at the drain timeout),
    then delete dir/<previous> (only the current version's files stay on the shared volume)
    data-parallel: barrier; rank > 0: current := <cap>-<lineage>-vN if listed in /v1/models, else Unavailable
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from trace_common.env import PolicyInfo
from trace_common.errors import ContextExhausted, FailedPrecondition, Unavailable
from trace_common.policy.base import AssistantTurn, Policy, PolicyRequest
from trace_common.policy.chat import ChatFormat
from trace_common.policy.errors import PolicyUnavailable
from trace_common.policy.http_backend import context_refusal

from .config import VLLMRolloutConfig
from .distributed import Dist
from .lora import save_pretrained_to
from .rollouts import PolicyRollouts

log = logging.getLogger(__name__)


class AdapterLoadError(Unavailable):
    """A LoRA version could not be loaded/verified after the bounded retries."""


class VLLMAdapterManager:
    """Load / verify / switch / unload adapter versions on one vLLM server (module docstring)."""

    def __init__(self, config: VLLMRolloutConfig, *, client: httpx.AsyncClient | None = None,
                 observe: Any = None, on_unloaded: Any = None):
        if not config.base_url:
            raise FailedPrecondition(f"vllm.profile={config.profile!r} is resolved to a base_url by the trainer "
                                     "service (TRACE_TRAINER_ENDPOINTS); called in-process, set vllm.base_url")
        self.config = config
        self.client = client or httpx.AsyncClient(timeout=config.request_timeout_s)
        self._owns_client = client is None
        self.current: str | None = None
        #: the server's context length (vLLM's max_model_len, read from /v1/models), None until seen
        self.max_model_len: int | None = None
        self.inflight: dict[str, int] = {}
        self._drained: dict[str, asyncio.Event] = {}
        self._unloads: set[asyncio.Task] = set()
        self.unloaded: list[str] = []
        self._tried: set[str] = set()
        self.observe = observe or (lambda outcome: None)
        self.on_unloaded = on_unloaded or (lambda name: None)

    # -- HTTP -------------------------------------------------------------------------------------
    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self.client.post(f"{self.config.base_url}/{path}", json=body,
                                      timeout=self.config.request_timeout_s)

    async def listed(self) -> set[str]:
        resp = await self.client.get(f"{self.config.base_url}/models", timeout=self.config.request_timeout_s)
        resp.raise_for_status()
        models = resp.json().get("data", [])
        lengths = [int(m["max_model_len"]) for m in models if isinstance(m.get("max_model_len"), int)]
        if lengths:
            self.max_model_len = min(lengths)
        return {m.get("id", "") for m in models}

    async def load(self, name: str, path: str) -> None:
        """Load `name` from `path` and verify it is listed; retries, then AdapterLoadError."""
        cfg = self.config
        last = "no attempt"
        # "already loaded" for a name this manager never tried to load is a stale adapter left on a
        # long-running server by an earlier attempt on the same checkpoints (same lineage, same
        # version number; module docstring): its weights are not ours, so it is replaced once. For a name we tried before it is our own earlier
        # attempt whose reply was lost, and only needs verifying.
        ours = name in self._tried
        self._tried.add(name)
        replaced = False
        for attempt in range(cfg.load_retries + 1):
            if attempt:
                await asyncio.sleep(cfg.retry_backoff_s * (2 ** (attempt - 1)))
            try:
                resp = await self._post("load_lora_adapter", {"lora_name": name, "lora_path": path})
                if resp.status_code >= 400 and "already" in resp.text.lower() and not ours and not replaced:
                    log.warning("vLLM already serves an adapter named %s that this run did not load; "
                                "replacing it with %s", name, path)
                    replaced = True
                    await self._post("unload_lora_adapter", {"lora_name": name})
                    resp = await self._post("load_lora_adapter", {"lora_name": name, "lora_path": path})
                ours = True  # from here on, "already loaded" can only be this call's own load
                if resp.status_code >= 400:
                    last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                    # 5xx (the worker failed to read/apply the files) and 404 (vLLM's "No adapter
                    # found": the path is not visible to the server, e.g. a shared volume that has
                    # not caught up yet) are retried; another 4xx is a refusal. A retried load whose
                    # first attempt succeeded reports "already loaded": verified below.
                    retryable = resp.status_code >= 500 or resp.status_code == 404
                    if not retryable and "already" not in resp.text.lower():
                        self.observe("rejected")
                        raise AdapterLoadError(f"vLLM refused to load adapter {name!r} from {path}: {last}; "
                                               "check --enable-lora, --max-lora-rank and that the path is "
                                               "readable by the server")
                if name in await self.listed():
                    self.observe("ok")
                    return
                if resp.status_code < 400 or "already" in resp.text.lower():
                    last = f"{name!r} not listed in /v1/models after loading (load answered HTTP {resp.status_code})"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            self.observe("retry")
        self.observe("failed")
        raise AdapterLoadError(f"could not load adapter {name!r} from {path} into vLLM at {cfg.base_url} after "
                               f"{cfg.load_retries + 1} attempts: {last}; the adapter directory must be readable "
                               "by the server at the same path, with a LoRA rank <= its --max-lora-rank")

    async def unload(self, name: str) -> None:
        try:
            resp = await self._post("unload_lora_adapter", {"lora_name": name})
            if resp.status_code >= 400 and resp.status_code != 404:
                log.warning("unloading adapter %s failed: HTTP %s %s", name, resp.status_code, resp.text[:200])
                return
            self.unloaded.append(name)
            self.on_unloaded(name)
        except httpx.HTTPError as exc:
            log.warning("unloading adapter %s failed: %s", name, exc)

    # -- versions -----------------------------------------------------------------------------------
    async def switch(self, name: str, path: str) -> None:
        """Load + verify `name`, make it current, unload the previous version (now if idle, else once drained)."""
        await self.load(name, path)
        previous, self.current = self.current, name
        if previous is None or previous == name:
            return
        if self.inflight.get(previous, 0) == 0:
            # Nothing runs on it (the trainer publishes between rollout batches): unload now, so
            # when publish returns exactly the new version is served. A background task would only
            # run when the caller's event loop next runs -- in the trainer, the next iteration.
            await self.unload(previous)
        else:
            task = asyncio.get_running_loop().create_task(self._unload_when_drained(previous))
            self._unloads.add(task)
            task.add_done_callback(self._unloads.discard)

    async def _unload_when_drained(self, name: str) -> None:
        if self.inflight.get(name, 0) > 0:
            event = self._drained.setdefault(name, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), self.config.drain_timeout_s)
            except TimeoutError:
                log.warning("adapter %s still has %d requests after %.0f s; unloading anyway", name,
                            self.inflight.get(name, 0), self.config.drain_timeout_s)
        await self.unload(name)

    async def adopt(self, name: str) -> None:
        """Serve `name`, which another process of this job loaded and verified (module docstring): no
        load, and the previous version is that process's to unload."""
        try:
            listed = await self.listed()
        except httpx.HTTPError as exc:
            raise AdapterLoadError(f"cannot list the models of the vLLM server at {self.config.base_url}: "
                                   f"{type(exc).__name__}: {exc}") from exc
        if name not in listed:
            raise AdapterLoadError(f"adapter {name!r}, loaded by rank 0 of this job, is not listed by the vLLM "
                                   f"server at {self.config.base_url}; every rank must reach the same server")
        self.current = name

    def acquire(self) -> str:
        if self.current is None:
            raise Unavailable("no adapter version is loaded yet (publish one first)")
        self.inflight[self.current] = self.inflight.get(self.current, 0) + 1
        return self.current

    def release(self, name: str) -> None:
        n = self.inflight.get(name, 0) - 1
        self.inflight[name] = max(0, n)
        if n <= 0 and name in self._drained:
            self._drained.pop(name).set()

    async def close(self) -> None:
        if self._unloads:
            await asyncio.gather(*list(self._unloads), return_exceptions=True)
        if self._owns_client:
            await self.client.aclose()


class VLLMPolicy(Policy):
    """Completions from vLLM for the manager's current adapter, prompts as token ids."""

    def __init__(self, manager: VLLMAdapterManager, tokenizer: Any, *, max_concurrency: int = 64,
                 name: str = "vllm"):
        super().__init__()
        self.manager = manager
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.name = name
        self._sem = asyncio.Semaphore(max_concurrency)
        from trace_common.policy.generation import stop_token_ids

        self.stop_ids = stop_token_ids(tokenizer, None)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[AssistantTurn]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: PolicyRequest) -> AssistantTurn:
        ids = self.encode(self.chat.render(request.messages, request.tools, add_generation_prompt=True))
        p = request.params
        max_tokens = p.max_tokens
        limit = self.manager.max_model_len
        if limit is not None:   # as the in-process backend: the reply gets the room left, none left ends it
            if limit - len(ids) < 1:
                raise ContextExhausted(f"the prompt has {len(ids)} tokens but the vLLM server's context is {limit}")
            max_tokens = min(max_tokens, limit - len(ids))
        body = {"prompt": ids, "max_tokens": max_tokens, "temperature": p.temperature, "top_p": p.top_p,
                "top_k": p.top_k if p.top_k > 0 else -1, "logprobs": 0, "return_tokens_as_token_ids": True,
                "skip_special_tokens": False, "stop_token_ids": self.stop_ids}
        if p.seed is not None:
            body["seed"] = p.seed
        async with self._sem:
            name = self.manager.acquire()
            started = time.perf_counter()
            try:
                body["model"] = name
                resp = await self.manager.client.post(f"{self.manager.config.base_url}/completions", json=body,
                                                      timeout=self.manager.config.request_timeout_s)
            except httpx.TimeoutException as exc:
                self.stats.record_failure("timeout")
                raise PolicyUnavailable(f"vLLM completion timed out: {exc}", kind="timeout") from exc
            except httpx.HTTPError as exc:
                self.stats.record_failure("connection")
                raise PolicyUnavailable(f"vLLM unreachable: {exc}", kind="connection") from exc
            finally:
                self.manager.release(name)
        if context_refusal(resp.status_code, _json_or_text(resp)):
            raise ContextExhausted(f"vLLM HTTP 400: {resp.text[:300]}")   # the episode ends, not an error
        if resp.status_code >= 400:
            self.stats.record_failure("http_error")
            raise PolicyUnavailable(f"vLLM HTTP {resp.status_code}: {resp.text[:300]}", kind="http_error",
                                    status=resp.status_code)
        try:
            choice = resp.json()["choices"][0]
            lp = choice.get("logprobs") or {}
            tokens = [int(str(t).split(":", 1)[1]) for t in lp.get("tokens") or []]
            logprobs = [float(x) if x is not None else 0.0 for x in lp.get("token_logprobs") or []]
            finish = choice.get("finish_reason") or "stop"
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self.stats.record_failure("bad_response")
            raise PolicyUnavailable(f"vLLM returned no token ids/logprobs ({exc}); it must support "
                                    "return_tokens_as_token_ids", kind="bad_response") from exc
        if finish == "stop" and (not tokens or tokens[-1] not in self.stop_ids):
            tokens.append(self.stop_ids[0])  # the stop token ends the turn in the rendered conversation
            logprobs.append(0.0)
        body_ids = tokens[:-1] if finish == "stop" else tokens
        text = self.tokenizer.decode(body_ids, skip_special_tokens=False)
        turn = AssistantTurn.from_text(text, request.turn_index, prompt_token_ids=ids, completion_token_ids=tokens,
                                       logprobs=logprobs, finish_reason="stop" if finish == "stop" else "length",
                                       prompt_tokens=len(ids), completion_tokens=len(tokens),
                                       seconds=time.perf_counter() - started)
        self.stats.record_turn(turn)
        return turn


class VLLMRollouts(PolicyRollouts):
    """`RolloutEngine` over a vLLM server: publish = save + load + verify + switch (+ drain/unload)."""

    def __init__(self, config: VLLMRolloutConfig, model: Any, *, capability: str, tokenizer: Any,
                 base_model_name: str = "", observe: Any = None, lineage: str = "", dist: Dist | None = None):
        self.config = config
        self.model = model
        #: the job's processes (None: one); rank 0 alone publishes the versions (module docstring)
        self.dist = dist
        self.capability = capability
        # the served name's stem: capability + checkpoint lineage (module docstring), in characters safe
        # in a path and a vLLM model name
        self.stem = "-".join(re.sub(r"[^A-Za-z0-9._-]+", "_", part) for part in (capability, lineage) if part)
        self.manager = VLLMAdapterManager(config, observe=observe, on_unloaded=self._forget)
        policy = VLLMPolicy(self.manager, tokenizer, name=base_model_name or "vllm")
        super().__init__(policy, PolicyInfo(model=base_model_name or "vllm", adapter=capability))

    def _forget(self, name: str) -> None:
        """An unloaded version's files are not needed any more (only the current one is kept)."""
        import shutil

        shutil.rmtree(Path(self.config.adapter_dir) / name, ignore_errors=True)

    def adapter_name(self, version: int) -> str:
        return f"{self.stem}-v{version}"

    async def publish(self, version: int) -> None:
        name = self.adapter_name(version)
        dist = self.dist if self.dist is not None and self.dist.enabled else None
        if dist is None or dist.is_main:
            path = Path(self.config.adapter_dir) / name
            await asyncio.to_thread(save_pretrained_to, self.model, path)
            await self.manager.switch(name, str(path))
        if dist is not None:
            # blocks the loop on purpose: publish runs between rollout batches, so nothing of this
            # process is waiting on it; a rank 0 that failed to load exits, and torchrun stops the others
            dist.barrier()
            if not dist.is_main:
                await self.manager.adopt(name)
        self.version = version

    async def close(self) -> None:
        await self.manager.close()


def _json_or_text(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return resp.text
