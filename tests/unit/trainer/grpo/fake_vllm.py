"""A small in-test HTTP server that speaks the vLLM endpoints the trainer uses, backed by a real
tiny transformers model with real PEFT adapters:

    GET  /v1/models                 base model + loaded adapters (id = lora_name)
    POST /v1/load_lora_adapter      {"lora_name", "lora_path"}: PeftModel.from_pretrained(copy of base)
                                    400 "...has already been loaded" for a known name (as vLLM)
    POST /v1/unload_lora_adapter    {"lora_name"}; 404 for an unknown name
    POST /v1/completions            prompt as token ids, return_tokens_as_token_ids, logprobs=0

Knobs for failure tests: `fail_loads` (next N loads answer 500), `load_delay_s` (sleep before
answering a load), `hide_loaded` (load answers 200 but the name is not listed), `reject_loads`
(400 with another reason). `in_flight` counts completions running per model name.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from peft import PeftModel

from trace_common.policy.generation import RowParams, generate_batch


class _Server(ThreadingHTTPServer):
    # the standard library's listen backlog is 5: two ranks open 16 connections at once, and on a loaded
    # machine the kernel dropped the overflow before the accept loop ran, so connects stalled past the
    # clients' retries (policy errors in the ranks' rows, not a property of the code under test); vLLM's
    # uvicorn listens with a backlog of 2048
    request_queue_size = 128


class FakeVLLM:
    def __init__(self, base: torch.nn.Module, stop_ids: list[int], pad_id: int, base_name: str = "base"):
        self.base = base
        self.base_name = base_name
        self.stop_ids = stop_ids
        self.pad_id = pad_id
        self.adapters: dict[str, Any] = {}
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.completions: list[str] = []
        self.prompts: list[list[int]] = []   # each accepted completion's prompt token ids, in arrival order
        self.in_flight: dict[str, int] = {}
        self.fail_loads = 0
        self.load_delay_s = 0.0
        self.hide_loaded = False
        #: the served context (vLLM's --max-model-len): reported by /v1/models and enforced by
        #: /v1/completions as vLLM does (prompt + max_tokens must fit); None: neither
        self.max_model_len: int | None = None
        self.max_tokens_asked: list[int] = []
        self.reject_loads = False
        self.completion_delay_s = 0.0
        self.lock = threading.Lock()
        self.model_lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, payload: Any) -> None:
                body = json.dumps(payload).encode() if not isinstance(payload, bytes) else payload
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):  # noqa: N802
                if self.path == "/v1/models":
                    with outer.lock:
                        names = [] if outer.hide_loaded else list(outer.adapters)
                    data = [{"id": outer.base_name, "object": "model"}] + [
                        {"id": n, "object": "model", "parent": outer.base_name} for n in names]
                    if outer.max_model_len is not None:
                        data = [{**d, "max_model_len": outer.max_model_len} for d in data]
                    return self._send(200, {"object": "list", "data": data})
                return self._send(404, {"error": "not found"})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                route = {"/v1/load_lora_adapter": outer._load, "/v1/unload_lora_adapter": outer._unload,
                         "/v1/completions": outer._complete}.get(self.path)
                if route is None:
                    return self._send(404, {"error": "not found"})
                status, payload = route(body)
                self._send(status, payload)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeVLLM:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- endpoints ----------------------------------------------------------------------------------
    def _load(self, body: dict[str, Any]) -> tuple[int, Any]:
        time.sleep(self.load_delay_s)
        name, path = body["lora_name"], body["lora_path"]
        with self.lock:
            self.loads.append(name)
            if self.fail_loads > 0:
                self.fail_loads -= 1
                return 500, {"error": "engine busy"}
            if self.reject_loads:
                return 400, {"error": f"LoRA rank of {name} exceeds --max-lora-rank"}
            if name in self.adapters:
                return 400, {"error": f"The lora adapter '{name}' has already been loaded."}
        model = PeftModel.from_pretrained(copy.deepcopy(self.base), path)
        model.eval()
        with self.lock:
            self.adapters[name] = model
        return 200, f"Success: LoRA adapter '{name}' added successfully.".encode()

    def _unload(self, body: dict[str, Any]) -> tuple[int, Any]:
        name = body["lora_name"]
        with self.lock:
            if name not in self.adapters:
                return 404, {"error": f"The lora adapter '{name}' cannot be found."}
            del self.adapters[name]
            self.unloads.append(name)
        return 200, f"Success: LoRA adapter '{name}' removed successfully.".encode()

    def _complete(self, body: dict[str, Any]) -> tuple[int, Any]:
        name = body["model"]
        with self.lock:
            model = self.adapters.get(name)
            if model is None:
                return 404, {"error": f"The model `{name}` does not exist."}
            self.max_tokens_asked.append(int(body["max_tokens"]))
            asked = len(body["prompt"]) + int(body["max_tokens"])
            if self.max_model_len is not None and asked > self.max_model_len:
                return 400, {"object": "error", "type": "BadRequestError", "code": 400, "message": (
                    f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                    f"{asked} tokens ({len(body['prompt'])} in the messages, {body['max_tokens']} in the "
                    "completion). Please reduce the length of the messages or completion.")}
            self.completions.append(name)
            self.prompts.append(list(body["prompt"]))
            self.in_flight[name] = self.in_flight.get(name, 0) + 1
        try:
            time.sleep(self.completion_delay_s)
            top_k = int(body.get("top_k", -1))
            params = RowParams(temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                               top_k=max(0, top_k), max_tokens=int(body["max_tokens"]), seed=body.get("seed"))
            with self.model_lock:
                out = generate_batch(model, [body["prompt"]], [params], stop_ids=body.get("stop_token_ids") or
                                     self.stop_ids, pad_id=self.pad_id)[0]
        finally:
            with self.lock:
                self.in_flight[name] -= 1
        return 200, {"id": "cmpl-x", "object": "text_completion", "model": name, "choices": [{
            "index": 0, "text": "", "finish_reason": "stop" if out.finish_reason == "stop" else "length",
            "logprobs": {"tokens": [f"token_id:{t}" for t in out.token_ids], "token_logprobs": out.logprobs}}]}
