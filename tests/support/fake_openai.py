"""A scripted OpenAI-compatible HTTP server for tests of *clients* (timeouts, retries, garbage).

It is a stand-in for an LLM endpoint's transport behaviour only; tests that claim model
behaviour use a real model server. Each request pops the next scripted reply:
  {"status": 200, "json": {...}} | {"status": 500} | {"raw": b"not json"} | {"sleep": 2.0, ...}
Requests are recorded in `.requests` (parsed JSON bodies).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(content: str = "", tool_calls: list[dict] | None = None, finish_reason: str = "stop") -> dict:
    msg: dict = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
        finish_reason = "tool_calls"
    return {"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "fake",
            "choices": [{"index": 0, "message": msg, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


class FakeOpenAI:
    def __init__(self, script: list[dict] | None = None, default: dict | None = None, latency: float = 0.0,
                 respond=None):
        """`respond(request_body) -> step`, when given, picks each reply from the request itself
        (concurrent episodes make a script's order arbitrary); else the script, then `default`."""
        self.script = list(script or [])
        self.default = default
        self.respond = respond
        self.latency = latency
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with outer._lock:
                    outer.requests.append(json.loads(body or b"{}"))
                    if outer.respond is not None:
                        step = outer.respond(outer.requests[-1])
                    else:
                        step = outer.script.pop(0) if outer.script else outer.default
                if step is None:
                    step = {"status": 500, "json": {"error": "script exhausted"}}
                time.sleep(step.get("sleep", outer.latency))
                if "raw" in step:
                    payload = step["raw"]
                else:
                    payload = json.dumps(step.get("json", {})).encode()
                try:
                    self.send_response(step.get("status", 200))
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
