"""The real base policy for calibration: a `PolicyRef` -> a calibration factory backed by a model.

Calibration (calibration.py) asks "can GRPO learn this environment from the base agent?",
so it must play the base agent itself, not a stand-in. This module plugs the shared policy
factory (`trace_common.policy.factory.open_policy`, the one the rollout service uses) into
the environment service as `Environments(calibration_factories=ModelCalibration(...))`:

    calibration = ModelCalibration(CalibrationSampling(temperature=1.0, max_tokens=256))
    maker = calibration(ref)        # cheap checks of the ref; INVALID_ARGUMENT naming the field
    maker = calibration(ref, spec.calibration_sampling)   # a job's own sampling over the settings
    await maker.prepare()           # loads the model (FAILED_PRECONDITION naming the field on failure)
    factory = maker()               # the PolicyFactory shape calibrate() drives
    ...
    await maker.release()

Where things run. The candidate environment runs in a sandbox worker; the policy runs in
this service process. Validation runs on worker threads, each calibrating on its own event
loop (`asyncio.run` in validation.py), while a model backend is bound to one loop (the
HTTP client's connections, the in-process batcher's collector). So every opened policy
lives on one `PolicyHost` thread with its own loop, and episode policies forward each turn
there (`run_coroutine_threadsafe`): concurrent episodes of every calibration running at the
same time reach the same backend, and the in-process `TransformersPolicy` answers them in
shared batches.

Loaded policies are cached by their ref (a job's capabilities share one model, and the next
job with the same base agent does not reload it); `keep_idle` of them stay loaded while no
job uses them, older idle ones are closed.

Failure modes, each named for the field that causes it:
  * a ref that cannot name a loadable model (unknown built-in name, a directory without
    config.json, HTTP without endpoint) -> `InvalidArgument` at job creation;
  * a model that fails to load (corrupt weights, unreadable URI, failed warm start) ->
    `FailedPrecondition` failing the job before any candidate is judged;
  * a backend that stops answering during calibration (`PolicyUnavailable`) ->
    `calibration.CalibrationPolicyFailed` (UNAVAILABLE) failing the job: an unreachable base
    model says nothing about the candidate, so it is never fed back as a rejection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trace_common.env import PolicyInfo
from trace_common.errors import FailedPrecondition, InvalidArgument, TraceError, Unavailable
from trace_common.model_refs import ModelRoots, check_policy_refs
from trace_common.policy.base import Policy, PolicyRequest, SamplingParams, derive_seed
from trace_common.specs import PolicyRefModel, SamplingModel

FIELD = "spec.calibration_policy"
MODEL_FIX = ("Give a built-in base agent (micro, smollm2, smollm2-base), a Hugging Face model directory written by "
             "save_pretrained (config.json, weights, tokenizer) that this service can read, or its file:// or s3:// "
             "URI; for a served model use backend POLICY_BACKEND_OPENAI_HTTP with endpoint.")
HTTP_FIX = "Set endpoint to the OpenAI-compatible base URL serving the base model, e.g. http://vllm:8000/v1."


class CalibrationSampling(BaseModel):
    """How the base policy samples during calibration (the service settings fill this)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, ge=0.0, le=5.0, description="Sampling temperature; GRPO samples at > 0, "
                               "and a greedy policy makes every group constant (no informative groups).")
    max_tokens: int = Field(256, ge=1, le=32768, description="Most tokens of one reply.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass (1.0: true sampling, as GRPO's default).")
    top_k: int = Field(0, ge=0, description="Top-k truncation (0: none, as GRPO's default).")
    keep_idle: int = Field(1, ge=0, le=16, description="Loaded policies kept while no job uses them.")


def check_ref(ref: PolicyRefModel, allowed: ModelRoots | None = None) -> None:
    """Cheap checks (no loading) that `ref` can name a calibration policy: InvalidArgument for a bad
    backend or endpoint; for the model and adapter, the one rule of trace_common/model_refs.py under
    `allowed` (the service's store and model roots; None: built-in agents only): PermissionDenied
    outside them, NotFound for an allowed directory that is not a model / adapter."""
    if ref.backend == "POLICY_BACKEND_OPENAI_HTTP":
        if not ref.endpoint:
            raise InvalidArgument(field=f"{FIELD}.endpoint", expected="the base URL of the served base model "
                                  "for backend POLICY_BACKEND_OPENAI_HTTP", fix=HTTP_FIX)
        return
    if ref.backend != "POLICY_BACKEND_IN_PROCESS":
        raise InvalidArgument(field=f"{FIELD}.backend", expected="POLICY_BACKEND_IN_PROCESS, _OPENAI_HTTP or "
                              "_SCRIPTED (model 'skill-mixture@<p>')", got=ref.backend,
                              fix="Use SCRIPTED only with model 'skill-mixture@<p>'; for the base agent choose "
                              "POLICY_BACKEND_IN_PROCESS or POLICY_BACKEND_OPENAI_HTTP.")
    check_policy_refs(ref, allowed or ModelRoots(), FIELD)


def describe_ref(ref: PolicyRefModel) -> dict[str, Any]:
    """What the validation report records about a model calibration policy."""
    out: dict[str, Any] = {"backend": ref.backend, "model": ref.model, "scripted_stand_in": False}
    for name in ("adapter_uri", "adapter_name", "endpoint", "composition_uri", "routing"):
        if getattr(ref, name):
            out[name] = getattr(ref, name)
    return out


@dataclass
class _Entry:
    task: asyncio.Future
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)


class PolicyHost:
    """Opened policies on one event-loop thread (see the module docstring).

    Every method may be awaited from any thread's event loop; all state changes happen on
    the host loop, so they need no locks."""

    def __init__(self, s3: Any = None, keep_idle: int = 1, allowed: ModelRoots | None = None):
        self.s3 = s3
        self.keep_idle = keep_idle
        self.allowed = allowed or ModelRoots()
        self._entries: dict[str, _Entry] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False

    @staticmethod
    def key(ref: PolicyRefModel) -> str:
        return ref.model_dump_json()

    def _submit(self, coro) -> concurrent.futures.Future:
        with self._start_lock:
            if self._closed:
                coro.close()
                raise FailedPrecondition("the calibration policy host is closed (the service is stopping)")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="calibration-policies", daemon=True)
                self._thread.start()
                self._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _on_host(self, coro):
        return await asyncio.wrap_future(self._submit(coro))

    # -- leases -----------------------------------------------------------------------------------
    async def acquire(self, ref: PolicyRefModel) -> Policy:
        """The opened policy for `ref` (loaded once, shared); pair with `release(ref)`."""
        return await self._on_host(self._acquire(self.key(ref), ref))

    async def release(self, ref: PolicyRefModel) -> None:
        await self._on_host(self._release(self.key(ref)))

    async def _acquire(self, key: str, ref: PolicyRefModel) -> Policy:
        from trace_common.policy.factory import open_policy

        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(asyncio.ensure_future(open_policy(ref, self.s3, allowed=self.allowed)))
        entry.leases += 1
        try:
            return await asyncio.shield(entry.task)
        except BaseException:
            entry.leases -= 1
            if entry.task.done() and self._entries.get(key) is entry and (
                    entry.task.cancelled() or entry.task.exception() is not None):
                del self._entries[key]  # a failed load is not cached: the next job tries again
            raise

    async def _release(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.leases = max(0, entry.leases - 1)
        entry.last_used = time.monotonic()
        idle = sorted((e.last_used, k) for k, e in self._entries.items() if e.leases == 0 and e.task.done())
        for _, k in idle[: max(0, len(idle) - self.keep_idle)]:
            await self._close_entry(self._entries.pop(k))

    @staticmethod
    async def _close_entry(entry: _Entry) -> None:
        if entry.task.done() and not entry.task.cancelled() and entry.task.exception() is None:
            await entry.task.result().close()
        elif not entry.task.done():
            entry.task.cancel()

    def loaded(self) -> int:
        """How many policies are loaded or loading (for tests and diagnostics)."""
        return len(self._entries)

    # -- turns -----------------------------------------------------------------------------------
    async def complete(self, policy: Policy, request: PolicyRequest):
        return await self._on_host(policy.complete(request))

    async def close(self) -> None:
        with self._start_lock:
            loop, self._closed = self._loop, True
        if loop is None:
            return

        async def close_all() -> None:
            for entry in list(self._entries.values()):
                await self._close_entry(entry)
            self._entries.clear()

        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(close_all(), loop))
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
        loop.close()


class ModelCalibrationFactory:
    """The rollout service's `PolicyFactory` shape over a hosted model policy (one per validation)."""

    def __init__(self, host: PolicyHost, policy: Policy, ref: PolicyRefModel, params: SamplingParams):
        self.host = host
        self.policy = policy
        self.params = params
        self.ref = ref
        self.info = PolicyInfo(model=ref.model, adapter=ref.adapter_uri or ref.adapter_name or ref.composition_uri
                               or None)
        #: The first backend failure (PolicyUnavailable) seen by any episode; calibrate() reports it.
        self.unavailable: Unavailable | None = None

    def describe(self) -> dict[str, Any]:
        return {**describe_ref(self.ref), **self.sampling()}

    def sampling(self) -> dict[str, Any]:
        """How every turn is sampled (the calibration-batches artifact records it)."""
        p = self.params
        return {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "max_tokens": p.max_tokens}

    def for_episode(self, env: Any, seed: int, sample_index: int, sampling_seed: int):
        async def policy(messages, tools):
            request = PolicyRequest(messages=messages, tools=tools, params=self.params)
            if self.params.temperature > 0:
                request.params = self.params.model_copy(update={"seed": derive_seed(sampling_seed,
                                                                                    request.turn_index)})
            try:
                turn = await self.host.complete(self.policy, request)
            except Unavailable as exc:
                self.unavailable = self.unavailable or exc
                raise
            return turn.to_policy_turn()
        return policy

    async def close(self) -> None:
        """Nothing to release per validation: the maker holds the model for the whole job."""


class CalibrationMaker:
    """One job's calibration policy: `prepare()` loads it, `()` makes a factory per validation,
    `release()` hands it back to the host's cache."""

    def __init__(self, host: PolicyHost, ref: PolicyRefModel, params: SamplingParams):
        self.host = host
        self.ref = ref
        self.params = params
        self.policy: Policy | None = None

    def describe(self) -> dict[str, Any]:
        return describe_ref(self.ref)

    async def prepare(self) -> None:
        if self.policy is not None:
            return
        try:
            self.policy = await self.host.acquire(self.ref)
        except asyncio.CancelledError:
            raise
        except TraceError as exc:
            raise self._load_error(f"{type(exc).__name__}: {exc.reason}") from None
        except Exception as exc:  # noqa: BLE001 - a loader's own exception types (OSError, safetensors, ...)
            raise self._load_error(f"{type(exc).__name__}: {exc}") from None

    def _load_error(self, why: str) -> FailedPrecondition:
        if self.ref.backend == "POLICY_BACKEND_OPENAI_HTTP":
            return FailedPrecondition(f"{FIELD}: cannot open the HTTP policy {self.ref.model!r} at "
                                      f"{self.ref.endpoint}: {why[:400]}. {HTTP_FIX}")
        return FailedPrecondition(f"{FIELD}.model: cannot load the calibration policy {self.ref.model!r} "
                                  f"({self.ref.backend}): {why[:400]}. {MODEL_FIX}")

    def __call__(self) -> ModelCalibrationFactory:
        if self.policy is None:
            raise FailedPrecondition("the calibration policy is not loaded: await prepare() before validating")
        return ModelCalibrationFactory(self.host, self.policy, self.ref, self.params)

    async def release(self) -> None:
        if self.policy is not None:
            self.policy = None
            await self.host.release(self.ref)


def sampling_params(settings: CalibrationSampling, job: SamplingModel | None = None) -> SamplingParams:
    """The calibration's SamplingParams: the service settings, each overridden by the job's non-zero
    field (a job's temperature 0 means "the setting", never greedy: greedy calibration makes every
    group constant). InvalidArgument naming the field when the combination is not a valid sampler."""
    values = {"temperature": settings.temperature, "top_p": settings.top_p, "top_k": settings.top_k,
              "max_tokens": settings.max_tokens}
    if job is not None:
        values.update({k: getattr(job, k) for k in values if getattr(job, k)})
    try:
        return SamplingParams(**values)
    except ValueError as exc:
        raise InvalidArgument(field="spec.calibration_sampling", expected="a valid sampler (temperature > 0 with "
                              "top_p in (0, 1], top_k >= 0, max_tokens in [1, 32768])", got=values,
                              fix=str(exc).splitlines()[0][:200]) from None


class ModelCalibration:
    """`calibration_factories` for `Environments`: PolicyRef (IN_PROCESS / OPENAI_HTTP) -> maker."""

    def __init__(self, sampling: CalibrationSampling | None = None, s3: Any = None,
                 allowed: ModelRoots | None = None):
        """`allowed`: where a calibration policy's model and adapter may lie (the service's
        `ModelRoots.of(settings)`; None: built-in agents only)."""
        self.sampling = sampling or CalibrationSampling()
        self.allowed = allowed or ModelRoots()
        self.host = PolicyHost(s3, keep_idle=self.sampling.keep_idle, allowed=self.allowed)

    def __call__(self, ref: PolicyRefModel, job: SamplingModel | None = None) -> CalibrationMaker:
        """`job`: the job's `spec.calibration_sampling`; each of its non-zero fields replaces the
        service setting's (tracectl passes the run's training temperature and its one completion
        cap, so the calibration episodes are sampled as the adapter's first GRPO iteration)."""
        check_ref(ref, self.allowed)
        return CalibrationMaker(self.host, ref, sampling_params(self.sampling, job))

    async def close(self) -> None:
        await self.host.close()
