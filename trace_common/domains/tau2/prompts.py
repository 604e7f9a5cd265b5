"""The prompts tau2-bench gives its agent and its user simulator, in tau2's exact format.

Agent: an `<instructions>` block (one tool call *or* one message per turn, follow the
policy) followed by the domain policy inside `<policy>` tags. The conversation then opens
with tau2's fixed assistant greeting, to which the user simulator replies first.

User simulator: the shared simulation guidelines (markdown from the data directory),
a blank line, and the task's user scenario inside `<scenario>` tags.
"""

from __future__ import annotations

from trace_common.domains.tau2.tasks import Task

#: The first message of every tau2 conversation (assistant -> user).
AGENT_GREETING = "Hi! How can I help you today?"

#: tau2's agent instruction text (prompt compatibility requires the same words).
AGENT_INSTRUCTION = (
    "You are a customer service agent that helps the user according to the <policy> provided below.\n"
    "In each turn you can either:\n"
    "- Send a message to the user.\n"
    "- Make a tool call.\n"
    "You cannot do both at the same time.\n"
    "\n"
    "Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."
)

#: User stop tokens: the goal is reached / the user was transferred / the scenario ran out.
STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
USER_STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)


def agent_system_prompt(policy: str) -> str:
    """tau2's agent system prompt around a domain policy."""
    return f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{policy}\n</policy>"


def user_system_prompt(guidelines: str, task: Task) -> str:
    """tau2's user-simulator system prompt: guidelines, then the scenario of `task`."""
    guidelines = guidelines.replace("<PERSONA_GUIDELINES>", "")
    return f"{guidelines}\n\n<scenario>\n{task.user_scenario.render()}\n</scenario>"


def user_stop_token(text: str | None) -> str | None:
    """The stop token contained in a user message, if any (tau2 checks containment)."""
    if not text:
        return None
    for token in USER_STOP_TOKENS:
        if token in text:
            return token
    return None
