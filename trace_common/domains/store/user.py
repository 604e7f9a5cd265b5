"""Scripted, deterministic user of the store domain (no LLM).

It answers from the task's `UserScenario` only:

- the opening message gives the user's identity and either every request (mode
  `all_at_once`) or the first one (mode `sequential`);
- each agent message is answered with the next request (sequential mode) or, once there
  is none left, with a closing line ending in the stop token `###STOP###`, which ends the
  episode -- so in `all_at_once` mode the agent's first message to the user is its final
  report, as the policy asks;
- two narrow reactive answers, at most `max_reactive` in an episode: a question asking for
  the email gets the email, a question asking for confirmation gets "yes". They never
  advance the script, so asking cannot skip a request.

The user never checks the agent's work: a request the agent forgets stays forgotten.
"""

from __future__ import annotations

from trace_common.domains.store.task_model import UserScenario

STOP_TOKEN = "###STOP###"
_CONFIRM_WORDS = ("confirm", "proceed", "shall i", "should i", "go ahead", "do you want")


class ScriptedUser:
    def __init__(self, scenario: UserScenario, max_reactive: int = 2):
        self.scenario = scenario
        self._queue = list(scenario.followups)
        self._reactive_left = max_reactive

    def opening(self) -> str:
        return self.scenario.opening

    def reply(self, agent_text: str) -> tuple[str, bool]:
        """The user's answer to one agent message and whether the conversation is over."""
        text = agent_text.lower()
        if "?" in text and self._reactive_left > 0:
            if "email" in text:
                self._reactive_left -= 1
                return f"My email is {self.scenario.email}.", False
            if any(word in text for word in _CONFIRM_WORDS):
                self._reactive_left -= 1
                return "Yes, please go ahead.", False
        if self._queue:
            return self._queue.pop(0), False
        return f"Thank you, that's all. {STOP_TOKEN}", True
