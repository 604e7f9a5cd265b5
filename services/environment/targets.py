"""The target environment a capability environment must resemble: its tools, ids, prompt format.

`resolve_target(ref)` instantiates the target from the registry (so a tau2 target reads its
data directory -- a missing directory is an error, never a silent fallback) and returns a
`TargetInfo`: every tool schema, the policy text, how the system prompt is framed, and --
for targets in `PROFILES` -- the small explicit table the environment library needs:

| role          | store                       | tau2-retail                  | library arguments                    |
|---------------|-----------------------------|------------------------------|--------------------------------------|
| find_user     | find_user_id_by_email       | find_user_id_by_email        | email                                |
| get_user      | get_user_details            | get_user_details             | user_id                              |
| get_order     | get_order_details           | get_order_details            | order_id                             |
| cancel        | cancel_pending_order        | cancel_pending_order         | order_id, reason                     |
| return_items  | return_delivered_order_items | return_delivered_order_items | order_id, item_ids, payment_method_id |

plus each target's id widths (store: '#W' + 5 digits, 5-digit items; tau2: '#W' + 7
digits, 10-digit items and products, 3-digit user suffix, 7-digit payment ids), output
style (terse text vs tau2's JSON records) and system-prompt frame (the store's policy as
is; tau2's `<instructions>...</instructions><policy>...</policy>` after which the
assistant greets first). `library_params` checks that every role's tool exists in the
target with exactly the arguments the library implements and fails with a clear
FailedPrecondition otherwise (a renamed tool, a changed argument, an unknown target).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from trace_common.env import make
from trace_common.errors import FailedPrecondition

from .library.kit import ROLE_ARGS


@dataclass(frozen=True)
class TargetProfile:
    """The explicit mapping of one known target onto the library's tool roles."""

    style: str
    roles: dict[str, str]
    formats: dict[str, int]
    system_template: str
    greeting: str | None = None


_SAME_NAMES = {"find_user": "find_user_id_by_email", "get_user": "get_user_details",
               "get_order": "get_order_details", "cancel": "cancel_pending_order",
               "return_items": "return_delivered_order_items"}


def _tau2_template() -> tuple[str, str]:
    from trace_common.domains.tau2.prompts import AGENT_GREETING, agent_system_prompt

    return agent_system_prompt("{policy}"), AGENT_GREETING


PROFILES: dict[str, TargetProfile] = {
    "store": TargetProfile(style="store", roles=dict(_SAME_NAMES), system_template="{policy}",
                           formats={"order_digits": 5, "item_digits": 5, "product_digits": 4, "user_digits": 4,
                                    "payment_digits": 5}),
    "tau2-retail": TargetProfile(style="tau2", roles=dict(_SAME_NAMES), system_template=_tau2_template()[0],
                                 greeting=_tau2_template()[1],
                                 formats={"order_digits": 7, "item_digits": 10, "product_digits": 10,
                                          "user_digits": 3, "payment_digits": 7}),
}


@dataclass
class TargetInfo:
    """What generation and validation need to know about the target."""

    name: str
    version: str
    params: dict[str, str]
    tool_schemas: list[dict[str, Any]]
    policy: str
    system_template: str
    greeting: str | None
    profile: TargetProfile | None = None
    notes: list[str] = field(default_factory=list)

    def schema(self, tool: str) -> dict[str, Any] | None:
        return next((s for s in self.tool_schemas if s["function"]["name"] == tool), None)

    def tool_names(self) -> list[str]:
        return [s["function"]["name"] for s in self.tool_schemas]

    def policy_excerpt(self, limit: int = 2500) -> str:
        text = self.policy.strip()
        return text if len(text) <= limit else text[:limit].rsplit("\n", 1)[0] + "\n[...]"

    def system_prompt_format(self) -> str:
        greeting = (f"\nThe conversation then starts with the assistant message {self.greeting!r}, "
                    "and the user's first message answers it.") if self.greeting else ""
        return f"The system prompt is this template with the environment's policy in place of {{policy}}:\n" \
               f"```\n{self.system_template}\n```{greeting}"

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "params": self.params, "tools": self.tool_names(),
                "style": self.profile.style if self.profile else None}

    def library_params(self, roles: tuple[str, ...]) -> dict[str, Any]:
        """The TARGET constant baked into a library environment that uses `roles`."""
        if self.profile is None:
            known = ", ".join(sorted(PROFILES))
            raise FailedPrecondition(
                f"target {self.name!r} has no tool mapping for the environment library (known targets: {known}); "
                "use GENERATION_MODE_LLM for it, or add a TargetProfile in services/environment/targets.py")
        tools: dict[str, Any] = {}
        for role in roles:
            name = self.profile.roles.get(role)
            schema = self.schema(name) if name else None
            if schema is None:
                raise FailedPrecondition(f"target {self.name!r} lacks the tool {name!r} that the library uses for "
                                         f"{role!r}; its tools are {', '.join(self.tool_names())}")
            props = set(schema["function"].get("parameters", {}).get("properties", {}))
            required = set(schema["function"].get("parameters", {}).get("required", []))
            want = set(ROLE_ARGS[role])
            if props != want or not required <= want:
                raise FailedPrecondition(
                    f"target {self.name!r}: tool {name!r} takes {sorted(props)} (required {sorted(required)}) but the "
                    f"library implements {sorted(want)} for {role!r}; the library does not fit this target")
            tools[role] = copy.deepcopy(schema)
        return {"name": self.name, "version": self.version, "style": self.profile.style, "tools": tools,
                "formats": dict(self.profile.formats), "system_template": self.system_template,
                "greeting": self.greeting}


def _params(name: str, uri: str, params: dict[str, str]) -> dict[str, str]:
    out = dict(params)
    if uri and name.startswith("tau2"):
        out.setdefault("data", uri.removeprefix("file://"))
    return out


def resolve_target(name: str, version: str = "", uri: str = "", params: dict[str, str] | None = None) -> TargetInfo:
    """Instantiate the target from the registry and describe it (see module docstring)."""
    args = _params(name, uri, params or {})
    env = make(name, version or None, **args)
    schemas = env.tool_schemas()
    profile = PROFILES.get(name)
    if name == "store":
        from trace_common.domains.store import load_policy

        policy = load_policy()
    elif hasattr(env, "domain") and hasattr(env.domain, "policy"):
        policy = env.domain.policy
    else:
        policy = env.description or ""
    template = profile.system_template if profile else "{policy}"
    greeting = profile.greeting if profile else None
    return TargetInfo(name=name, version=env.version, params=args, tool_schemas=schemas, policy=policy,
                      system_template=template, greeting=greeting, profile=profile)
