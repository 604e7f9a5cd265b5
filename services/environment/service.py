"""The environment service's domain object: generation jobs, the registry, episodes (no gRPC here).

A generation job takes one or more capabilities and a target; per capability, in
parallel, it obtains a candidate (library bundle or LLM-written module, see
candidates.py), validates it in sandbox workers (validation.py) and registers it --
accepted or rejected, with its validation report -- in the artifact store (registry.py).
The job succeeds when every capability got a verdict; `environments_of(job_id)` lists the
records as they are registered. Bad requests (unknown target, a library target whose
tools do not fit, a capability the library lacks, a calibration backend not wired in)
fail at creation, before a job exists.

Calibration policy. The real base agent: `spec.calibration_policy` with backend IN_PROCESS
or OPENAI_HTTP goes through `calibration_factories`, a callable (PolicyRefModel -> factory
maker); the service's app passes `calibration_policy.ModelCalibration` (the shared policy
factory). A maker may have `async prepare()` / `release()` (load the model before the first
candidate is judged, hand it back after the job). Backend SCRIPTED with model
`skill-mixture[@p]` uses `policies.ScriptedSkillFactory(p)`; so does a spec that names no
calibration policy (default p: `calibration_skill_p`) -- a named fallback, never silent:
the job's progress says so and every report records `scripted_stand_in: true`.

Outbound endpoints are the operator's (`endpoints`, from TRACE_ENVIRONMENT_ENDPOINTS; see
trace_common/endpoints.py): `spec.llm` and an OPENAI_HTTP `spec.calibration_policy` name one of
its profiles, and target parameters that would choose a URL or key are refused. Every refusal is
PERMISSION_DENIED at creation, before a job exists and before anything is sent.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from trace_common.artifacts import ArtifactStore, open_store
from trace_common.data_roots import own_data_hidden
from trace_common.endpoints import Endpoints, refuse_outbound_params
from trace_common.errors import InvalidArgument, Unimplemented
from trace_common.jobs import JobManager, JobRecord, Output, estimate_footprint
from trace_common.llm import ChatClient, LlmConfig
from trace_common.specs import PolicyRefModel, SamplingModel

from . import library
from . import metrics as m
from .baseline_policies import ScriptedSkillFactory
from .candidates import MODE_LIBRARY, MODE_LLM, GenerationResult, generate_library, generate_llm, load_prompt
from .metrics import M
from .registry import EnvironmentRecord, EnvironmentRegistry
from .sandbox.parent import sandbox_for
from .serving import EpisodeTable, StepOutcome
from .settings import EnvironmentSettings
from .specs import GenerationSpecModel
from .targets import DATA_ROOTS_SETTING, TargetInfo, confined_params, resolve_target
from .validation import ValidationConfig, ValidationReport, validate

FactoryMaker = Callable[[], Any]
log = logging.getLogger(__name__)
_SCRIPTED = re.compile(r"^skill-mixture(?:@(?P<p>0(?:\.\d+)?|1(?:\.0+)?))?$")


def _describe_maker(maker: FactoryMaker) -> dict[str, Any]:
    """The calibration policy's description (backend, model, scripted_stand_in, ...)."""
    describe = getattr(maker, "describe", None)
    if describe is None:
        factory = maker()
        describe = getattr(factory, "describe", None)
        if describe is None:
            return {"model": getattr(getattr(factory, "info", None), "model", type(factory).__name__)}
    return dict(describe())


def calibration_batches(report: ValidationReport) -> tuple[list[Any], dict[str, Any]] | None:
    """What `EnvironmentRegistry.register` stores as the calibration batches of an ACCEPTED candidate:
    its calibration's played episodes with how they were played; None for a rejected candidate or a
    policy that reported no sampling parameters (the scripted stand-in samples no tokens)."""
    run = report.calibration_run()
    if report.status != "ACCEPTED" or run is None or not run.trajectories or not run.sampling:
        return None
    check = next(c for c in report.checks if c.name == "calibration")
    info = report.calibration_policy_info
    adapter = next((str(info[k]) for k in ("adapter_uri", "adapter_name", "composition_uri") if info.get(k)), "")
    return list(run.trajectories), {
        "policy_model": str(info.get("model") or run.policy), "policy_adapter": adapter,
        "policy_backend": str(info.get("backend", "")), "sampling": dict(run.sampling),
        "max_turns": int(check.details["max_turns"]), "split": str(check.details.get("split") or ""),
        "seeds": list(run.seeds[:run.played_groups]), "group_size": run.group_size,
        "sampling_seeds": f"calibration.sampling_seed(base={report.config.get('seed', 0)}, seed, sample), then "
                          "trace_common.policy.base.derive_seed(that, turn) per turn"}


class Environments:
    def __init__(self, settings: EnvironmentSettings, store: ArtifactStore | None = None,
                 calibration_factories: Callable[[PolicyRefModel], FactoryMaker] | None = None):
        self.settings = settings
        self.jobs = JobManager.from_settings("environment", M, settings)
        self.store = store or open_store(settings.artifact_root, settings.s3_settings(), M.artifact_observer)
        self.registry = EnvironmentRegistry(self.store)
        self.registry.load()
        self.sandbox = settings.sandbox_config()
        self.episodes = EpisodeTable(self.registry, self.sandbox, max_open=settings.max_open_episodes,
                                     idle_timeout_s=settings.episode_idle_timeout_s,
                                     idle_workers=settings.idle_workers_per_env)
        self.prompt = load_prompt(settings.prompt_path or None)
        self.calibration_factories = calibration_factories
        #: The operator's endpoint profiles (the embedded stack's operator may add more in-process).
        self.endpoints = Endpoints(settings.endpoints, "TRACE_ENVIRONMENT_ENDPOINTS")
        #: Directories a request's target may name data under (TRACE_ENVIRONMENT_DATA_ROOTS; the embedded
        #: stack's operator may add more in-process, as it adds endpoints).
        self.data_roots = list(settings.data_roots)
        self._job_envs: dict[str, list[EnvironmentRecord]] = {}

    # -- generation jobs ---------------------------------------------------------------------
    def calibration_maker(self, policy: PolicyRefModel | None, sampling: SamplingModel | None = None) -> FactoryMaker:
        """The job's calibration policy maker; `sampling` (spec.calibration_sampling) reaches model
        backends (a scripted stand-in samples nothing)."""
        if policy is None:
            p = self.settings.calibration_skill_p
            note = (f"fallback: the job named no calibration_policy, so the scripted stand-in skill-mixture@{p:g} "
                    "played instead of the base model; set spec.calibration_policy to calibrate with the base agent")
            return lambda: ScriptedSkillFactory(p, note)
        if policy.backend == "POLICY_BACKEND_SCRIPTED":
            match = _SCRIPTED.match(policy.model)
            if match is None:
                raise InvalidArgument(field="spec.calibration_policy.model",
                                      expected="'skill-mixture' or 'skill-mixture@<p>' with p in [0, 1]",
                                      got=policy.model)
            p = float(match["p"]) if match["p"] else self.settings.calibration_skill_p
            return lambda: ScriptedSkillFactory(p)
        policy = self.endpoints.policy(policy, "spec.calibration_policy")  # OPENAI_HTTP: the operator's endpoint
        if self.calibration_factories is None:
            raise Unimplemented(f"calibration with policy backend {policy.backend} is not wired into the environment "
                                "service yet: pass calibration_factories to Environments (services/environment/"
                                "service.py), or use a SCRIPTED 'skill-mixture@<p>' calibration policy")
        return self.calibration_factories(policy, sampling) if sampling is not None else self.calibration_factories(policy)

    def create_job(self, spec: GenerationSpecModel, run_id: str, labels: dict[str, str],
                   request_id: str, maker: FactoryMaker | None = None) -> JobRecord:
        """Start a generation job. `maker` is `calibration_maker(spec.calibration_policy)` when
        the caller already made it (the servicer does, off the event loop)."""
        self.jobs.validate_request(run_id, labels, request_id)
        ref = spec.target
        refuse_outbound_params(ref.params, "spec.target.params")
        endpoint = self.endpoints.llm(spec.llm, "spec.llm") if spec.llm is not None else None
        # a data directory the request names lies under the operator's roots (PERMISSION_DENIED otherwise);
        # none named and the service's own missing: a NotFound without that path (it may lie under HOME)
        params = confined_params(ref.name, ref.uri, dict(ref.params), self.data_roots)
        with own_data_hidden(ref.name, ref.version, params, setting=DATA_ROOTS_SETTING):
            target = resolve_target(ref.name, ref.version, params=params)
        library_mode = spec.mode == MODE_LIBRARY
        client = None
        if library_mode:
            for cap in spec.capabilities:  # fail now, not inside the job
                target.library_params(library.roles(library.require_family(cap.name)))
        else:
            assert spec.llm is not None and endpoint is not None
            client = ChatClient(LlmConfig.of(endpoint, timeout_seconds=spec.llm.timeout_seconds
                                             or self.settings.llm_timeout_s))
        maker = maker or self.calibration_maker(spec.calibration_policy, spec.calibration_sampling)
        prepare, release = getattr(maker, "prepare", None), getattr(maker, "release", None)
        who = _describe_maker(maker)
        vconfig = self.settings.validation_config(band=spec.band, seed=spec.seed,
                                                  min_informative=spec.calibration_min_informative)
        retries = spec.max_retries or self.settings.default_max_retries

        async def body(ctx):
            records = self._job_envs.setdefault(ctx.job_id, [])
            cancel = threading.Event()
            total = len(spec.capabilities)
            if who.get("scripted_stand_in"):
                log.warning("generation job %s: calibration by the scripted stand-in %s (%s)", ctx.job_id,
                            who.get("model"), who.get("note", ""))
            calibrator = f"{'scripted stand-in ' if who.get('scripted_stand_in') else ''}{who.get('model')}"
            # Progress counts calibration episodes (most of the job's time with a real base model):
            # `per_env` per attempt; a finished attempt counts in full (also when it was rejected
            # before calibrating), and each further attempt (an LLM-mode retry, an easier library
            # level) adds `per_env` to the total, so the count only grows.
            loop = asyncio.get_running_loop()
            per_env = vconfig.groups * vconfig.group_size
            played = dict.fromkeys((c.name for c in spec.capabilities), 0)
            attempts = dict.fromkeys((c.name for c in spec.capabilities), 0)

            def show(name: str | None = None, episodes: int = 0) -> None:
                if name is not None:
                    played[name] = per_env * max(0, attempts[name] - 1) + episodes
                further = sum(max(0, n - 1) for n in attempts.values())
                ctx.progress(completed=sum(played.values()), total=per_env * (total + further),
                             stage=f"calibration episodes, {len(records)}/{total} environments done")

            def next_attempt(name: str) -> None:
                attempts[name] += 1
                show(name, 0)

            if prepare is not None:
                ctx.progress(completed=0, total=per_env * total, stage="loading calibration policy",
                             message=f"loading {who.get('model')} ({who.get('backend')})")
                await prepare()
            show()
            ctx.progress(message=f"{total} capabilities, mode {spec.mode.removeprefix('GENERATION_MODE_').lower()}, "
                                 f"calibration by {calibrator}")

            async def one(cap) -> EnvironmentRecord:
                def step(done: int, _n: int) -> None:  # called on validate's thread
                    loop.call_soon_threadsafe(show, cap.name, done)

                async def check(source: str) -> ValidationReport:
                    next_attempt(cap.name)
                    return await asyncio.to_thread(validate, source, target, vconfig,
                                                   sandbox_for(self.sandbox, MODE_LIBRARY if library_mode else MODE_LLM),
                                                   maker(),
                                                   label=cap.name, cancel=cancel, on_calibration_progress=step)
                if library_mode:
                    result = await generate_library(cap.name, target, check)
                else:
                    result = await generate_llm(cap.model_dump(), target, client, check, vconfig, max_retries=retries,
                                                prompt=self.prompt, max_tokens=self.settings.llm_max_tokens,
                                                temperature=self.settings.llm_temperature, seed=spec.seed or None)
                record = await asyncio.to_thread(self._register, run_id, result, target)
                records.append(record)
                for kind, art in (("environment-code", record.code), ("validation-report", record.validation),
                                  ("environment-manifest", record.manifest)):
                    ctx.add_output(Output(art["uri"], art["sha256"], int(art["size"]), kind))
                show(cap.name, per_env)
                level = result.attempts[-1].level if result.attempts else None
                ctx.progress(message=f"{cap.name}: {record.status.lower()}"
                             + (f" at {level} cases per instance (levels tried: "
                                f"{', '.join(str(a.level) for a in result.attempts)})" if level else ""))
                return record

            try:
                done = await asyncio.gather(*(one(c) for c in spec.capabilities))
            except BaseException:
                cancel.set()
                raise
            finally:
                if client is not None:
                    await client.close()
                if release is not None:
                    await release()
            accepted = sum(r.accepted for r in done)
            ctx.set_metrics({"accepted": accepted, "rejected": len(done) - accepted})
            ctx.progress(stage="done", message=f"{accepted} of {len(done)} accepted")
            return done

        return self.jobs.submit("generation", body, run_id=run_id, labels=labels, request_id=request_id,
                                footprint=estimate_footprint(spec))

    def _register(self, run_id: str, result: GenerationResult, target: TargetInfo) -> EnvironmentRecord:
        report = result.report
        m.VALIDATIONS.labels("library" if result.mode == MODE_LIBRARY else "llm", report.status.lower()).inc()
        return self.registry.register(calibration=calibration_batches(report),
            run_id=run_id, capability=result.capability, mode=result.mode, source=result.source,
            report=report.model_dump(mode="json"), target=target.summary(),
            tool_schemas=list(report.candidate.get("tool_schemas") or []),
            extra={"family": result.family, "extracted": result.extracted,
                   "level": result.attempts[-1].level if result.attempts else None,
                   "kit_sha256": library.kit_sha256() if result.mode == MODE_LIBRARY else None,
                   "calibration_policy": report.calibration_policy,
                   "calibration_policy_info": report.calibration_policy_info})

    def environments_of(self, job_id: str) -> list[EnvironmentRecord]:
        self.jobs.get(job_id)
        return list(self._job_envs.get(job_id, []))

    # -- registry ------------------------------------------------------------------------------
    def list_environments(self, capability: str, include_rejected: bool) -> list[EnvironmentRecord]:
        return self.registry.list(capability, include_rejected)

    def get_environment(self, name: str, version: str) -> EnvironmentRecord:
        return self.registry.get(name, version)

    def validation_config(self) -> ValidationConfig:
        return self.settings.validation_config()

    # -- episodes ------------------------------------------------------------------------------
    async def reset_episode(self, name: str, version: str, seed: int):
        record = self.registry.get(name, version, accepted_only=True)
        return await self.episodes.reset(record, seed)

    def check_episode(self, episode_id: str) -> None:
        """Raise InvalidArgument / NotFound unless `episode_id` names an open episode."""
        self.episodes.get(episode_id)

    async def step_episode(self, episode_id: str, action: dict[str, Any]) -> StepOutcome:
        return await self.episodes.step(episode_id, action)

    async def close_episode(self, episode_id: str) -> None:
        await self.episodes.close(episode_id)

    async def close(self) -> None:
        await self.jobs.shutdown()
        await asyncio.to_thread(self.episodes.shutdown)
        closer = getattr(self.calibration_factories, "close", None)
        if closer is not None:
            await closer()
