"""The LLM user simulator: prompt construction, role flipping, seeding, stop tokens, failures.

The user LLM is stood in for by a tiny HTTP server in this file that answers
`POST /v1/chat/completions` with canned OpenAI responses and records each request. It is
the user LLM's stand-in for these unit tests only: what is tested is the simulator's side
(what it sends through the real `openai` client, and what it does with the replies), not
any model behaviour.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trace_common.domains.tau2.environment import Tau2Environment, make_tau2_retail
from trace_common.domains.tau2.prompts import AGENT_GREETING, user_system_prompt
from trace_common.domains.tau2.user_simulator import LLMUserSimulator, UserLLMConfig
from trace_common.env import Message, MessageAction, Termination, ToolCall, run_episode
from trace_common.errors import Unavailable


class CannedChatServer:
    """Answers each chat-completions request with the next canned reply (text or status)."""

    def __init__(self, replies: list[str | int], delay_s: float = 0.0):
        self.replies = list(replies)
        self.delay_s = delay_s
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.requests.append({"path": self.path, "body": body})
                reply = outer.replies.pop(0) if outer.replies else 500
                time.sleep(outer.delay_s)
                if isinstance(reply, int):
                    payload, status = json.dumps({"error": {"message": "canned failure"}}).encode(), reply
                else:
                    status = 200
                    payload = json.dumps({
                        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": reply}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory() -> Iterator:
    servers: list[CannedChatServer] = []

    def make(replies, delay_s: float = 0.0) -> CannedChatServer:
        servers.append(CannedChatServer(replies, delay_s))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def llm_env(retail, server, **config) -> Tau2Environment:
    cfg = UserLLMConfig(base_url=server.base_url, model="user-sim", timeout_s=5, max_retries=0, **config)
    return Tau2Environment(retail, LLMUserSimulator(cfg))


def test_prompt_and_role_flipping(retail, server_factory):
    server = server_factory(["Hi, I want to exchange two items.", "Yes, order #W2378156.", "###STOP###"])
    env = llm_env(retail, server, seed=7)
    obs = env.reset(0)
    assert obs.messages[-1].content == "Hi, I want to exchange two items."
    env.step(MessageAction("Which order?"))
    system = user_system_prompt(retail.user_guidelines(), retail.task_by_id("0"))
    first, second = (r["body"] for r in server.requests)
    assert server.requests[0]["path"] == "/v1/chat/completions"
    assert first["messages"] == [{"role": "system", "content": system}, {"role": "user", "content": AGENT_GREETING}]
    assert second["messages"] == [
        {"role": "system", "content": system},
        {"role": "user", "content": AGENT_GREETING},
        {"role": "assistant", "content": "Hi, I want to exchange two items."},
        {"role": "user", "content": "Which order?"},
    ]
    assert (first["model"], first["temperature"], first["seed"]) == ("user-sim", 0.0, 7)
    assert system.endswith("\n\n<scenario>\nInstructions:\n\tDomain: retail\n\tReason for call:\n\t\tYou received "
                           "your order #W2378156" + system.split("#W2378156", 1)[1])


def test_seed_is_only_sent_when_configured(retail, server_factory):
    server = server_factory(["Hello"])
    llm_env(retail, server).reset(1)
    assert "seed" not in server.requests[0]["body"]


@pytest.mark.parametrize(("last_reply", "termination"), [
    ("Perfect, that's all. ###STOP###", Termination.DONE),
    ("###TRANSFER###", Termination.USER_STOP),
    ("###OUT-OF-SCOPE###", Termination.USER_STOP),
])
def test_llm_user_stop_tokens_end_a_gold_episode(last_reply, termination, retail, server_factory):
    task = retail.task_by_id("38")
    server = server_factory(["I'd like to cancel an order.", last_reply])
    pending = list(task.gold_actions)

    def policy(messages, tools):
        if pending:
            action = pending.pop(0)
            return Message.assistant(tool_calls=[ToolCall.create(f"c{len(messages)}", action.name, action.arguments)])
        return Message.assistant("Your order is cancelled.")

    traj = run_episode(llm_env(retail, server), policy, seed=retail.seed_of("38"))
    assert traj.termination is termination
    assert traj.messages[-1].content == last_reply
    assert (traj.reward, traj.failure_reason) == (1.0, None)
    assert len(server.requests) == 2  # the greeting's reply, then the closing message's reply


@pytest.mark.parametrize(("replies", "delay_s", "match"), [
    ([500], 0.0, "InternalServerError"),
    ([404], 0.0, "NotFoundError"),
    (["late"], 1.0, "APITimeoutError"),
])
def test_endpoint_failures_raise_unavailable(replies, delay_s, match, retail, server_factory):
    server = server_factory(replies, delay_s=delay_s)
    cfg = UserLLMConfig(base_url=server.base_url, model="m", timeout_s=0.3, max_retries=0)
    env = Tau2Environment(retail, LLMUserSimulator(cfg))
    with pytest.raises(Unavailable, match=match):
        env.reset(0)


def test_registry_parameters_build_the_llm_user(retail, server_factory, data_root):
    server = server_factory(["Hi there"])
    env = make_tau2_retail(data=str(data_root), user_base_url=server.base_url, user_model="sim",
                           user_seed="11", user_temperature="0.5")
    assert env.reset(3).messages[-1].content == "Hi there"
    body = server.requests[0]["body"]
    assert (body["model"], body["seed"], body["temperature"]) == ("sim", 11, 0.5)


def test_config_rejects_non_http_urls():
    with pytest.raises(ValueError, match="http"):
        UserLLMConfig(base_url="127.0.0.1:8000", model="m")
