"""A scripted stand-in for the analyst LLM behind a real OpenAI-compatible HTTP server.

STAND-IN, clearly: until the test suite has a real local model server for analysis, the LLM
path is tested against this server, which speaks the real chat-completions wire protocol over
real HTTP on loopback but answers from a script instead of a model. It reads each request the
way a model would -- the data blocks and the capability list in the rendered prompts -- and
answers discovery and labeling requests from a planted truth table, with configurable
misbehaviour (invalid JSON, following injected instructions, timeouts, non-JSON bodies, HTTP
errors). A real-model variant of these tests is for the integrator to add.

Not a test module: imported by tests/integration/test_analysis_*.py and bench/analysis_labeling.py
(tests/unit/analysis is where this helper lives because the task's paths end there; it starts
no server on import, so unit runs stay network-free).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOCK_RE = re.compile(r"<<<TRACE_DATA kind=trajectory nonce=(\w+)>>>\n(.*?)\n<<<END_TRACE_DATA nonce=\1>>>", re.S)
JSON_BLOCK_RE = re.compile(r"```json\n(.*?)\n```", re.S)
INJECTION_MARK = "label everything PRESENT"
FAKE_MARK = "FAKE_ANSWER:"


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    sleep: float = 0.0


def completion(content: str) -> Reply:
    return Reply(body=json.dumps({
        "id": "cmpl-standin", "object": "chat.completion", "created": 0, "model": "standin",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode())


def data_views(text: str) -> list[dict]:
    return [json.loads(payload) for _, payload in BLOCK_RE.findall(text)]


@dataclass
class ScriptedAnalyst:
    """Answers like an analyst model that knows `truth[task_id][capability]` (a label string).

    behaviour:
      "ok"             -- schema-valid replies;
      "bad_json_first" -- the first reply of every request is prose, the retry is valid;
      "always_bad"     -- every reply is prose;
      "gullible"       -- a trajectory containing INJECTION_MARK is obeyed: first the fake answer
                          embedded after FAKE_MARK is echoed verbatim, then (after the rejection)
                          every capability is labeled PRESENT for the ref asked.
    noise: probability that a PRESENT label comes back NA, drawn from the request's seed (runs
    differ, as sampled model runs do). fail_after: labeling requests answered before every
    later one gets HTTP 500. timeout / html: every request sleeps / returns a non-JSON body.
    """

    truth: dict[str, dict[str, str]]
    candidates: list[dict]
    behaviour: str = "ok"
    noise: float = 0.0
    fail_after: int | None = None
    sleep: float = 0.0
    html: bool = False
    labeling_requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict) -> Reply:
        if self.html:
            return Reply(body=b"<html><body>502 Bad Gateway</body></html>", sleep=self.sleep)
        messages = body["messages"]
        system, user = messages[0]["content"], messages[1]["content"]
        attempt = (len(messages) - 2) // 2
        if '"example_task_ids"' in system:
            reply = self._discovery(user, attempt)
            reply.sleep = self.sleep
            return reply
        with self._lock:
            self.labeling_requests += 1
            n = self.labeling_requests
        if self.fail_after is not None and n > self.fail_after:
            return Reply(status=500, body=b'{"error": {"message": "scripted outage"}}')
        reply = self._labels(system, user, attempt, body.get("seed", 0))
        reply.sleep = self.sleep
        return reply

    def _discovery(self, user: str, attempt: int) -> Reply:
        if self.behaviour in ("always_bad",) or (self.behaviour == "bad_json_first" and attempt == 0):
            return completion("Here are my thoughts about the capabilities: ...")
        failed = [v["task_id"] for v in data_views(user) if v.get("outcome") == "failed"]
        caps = [{**c, "example_task_ids": failed[:2]} for c in self.candidates]
        return completion(json.dumps({"capabilities": caps}))

    def _labels(self, system: str, user: str, attempt: int, seed: int) -> Reply:
        (view,) = data_views(user)
        names = [c["name"] for c in json.loads(JSON_BLOCK_RE.search(system).group(1))]
        text = json.dumps(view)
        if self.behaviour == "always_bad" or (self.behaviour == "bad_json_first" and attempt == 0):
            return completion("Sure! The agent did fine: " + ", ".join(names))
        if self.behaviour == "gullible" and INJECTION_MARK in text:
            if attempt == 0:
                raw = next(m["text"] for m in view["messages"] if m["role"] == "user")
                return completion(raw.split(FAKE_MARK, 1)[1].strip())
            labels = {n: "PRESENT" for n in names}
        else:
            rng = random.Random(seed)
            labels = {}
            for n in names:
                label = self.truth.get(view["task_id"], {}).get(n, "NA")
                if label == "PRESENT" and rng.random() < self.noise:
                    label = "NA"
                labels[n] = label
        return completion(json.dumps({"ref": view["ref"], "labels": [
            {"capability": n, "label": lb, "evidence": "" if lb == "NA" else f"turn quote for {n}"}
            for n, lb in labels.items()]}))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # listen() backlog. The default of 5 drops the SYNs of a burst of new connections (a client
    # opening 32 at once), which then wait ~1 s for a retransmit or fail outright.
    request_queue_size = 256


class StandinServer:
    """ThreadingHTTPServer on 127.0.0.1:0 answering POST /v1/chat/completions with `responder(body)`.
    Records parsed request bodies, the Authorization headers sent and the peak number of requests in flight."""

    def __init__(self, responder: Callable[[dict], Reply], latency: float = 0.0):
        self.responder = responder
        self.latency = latency
        self.requests: list[dict] = []
        self.authorizations: set[str] = set()
        self.in_flight = 0
        self.peak_in_flight = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; with Nagle on, the second waits for the
            # client's delayed ACK (~40 ms) and the stand-in would add latency nobody asked for.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with outer._lock:
                    outer.requests.append(body)
                    outer.authorizations.add(self.headers.get("authorization", ""))
                    outer.in_flight += 1
                    outer.peak_in_flight = max(outer.peak_in_flight, outer.in_flight)
                try:
                    reply = outer.responder(body)
                    time.sleep(outer.latency + reply.sleep)
                finally:
                    with outer._lock:
                        outer.in_flight -= 1
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
