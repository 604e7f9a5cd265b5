"""What a built base agent depends on, as digests: its build code and its training data.

A base agent is a function of (config, training data, build code). The cache key of a built
agent and the build record of a shipped one (`shipped.py`) carry all three, so a change to the
domain that changes the expert's conversations, or a change to the training code, is a
different agent -- never a stale cached one.

* **code digest** -- per file of `BUILD_CODE` (the modules whose code turns data into weights:
  warm start, tokenizer, chat rendering), sha256 over the module's AST with docstrings removed
  (`ast.dump` drops comments and formatting), so editing prose does not invalidate a build.
* **data digest** -- sha256 over the rendered training conversations (the exact texts the
  tokenizer is trained on and the warm start imitates). Computing it means playing the expert
  (about 12 s for the micro agent's 2,000 episodes here), so it is memoised in the cache
  directory under a digest of every `trace_common` source file (raw bytes) and the data config:
  any source edit recomputes it once.

Both are deterministic functions of the source tree and the config; `digest_differences`
names what changed between two records, for the messages that say why something is rebuilt.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trace_common.pyast import parse

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # .../trace_common
#: Modules (relative to trace_common/) whose code maps training data to weights. The domain and
#: episode code is not listed: it reaches the model only through the data, which has its own digest.
BUILD_CODE: dict[str, tuple[str, ...]] = {
    "micro": ("agents/micro.py", "agents/sft.py", "agents/tokenizer.py", "policy/chat.py", "policy/toolcalls.py"),
    "smollm2": ("agents/smollm2.py", "agents/sft.py", "policy/chat.py", "policy/toolcalls.py"),
}
MEMO_NAME = "data-digests.json"
_memo_lock = threading.Lock()


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def source_digest(path: Path) -> str:
    """sha256 of a Python file's code: its AST without docstrings (comments and layout never reach it)."""
    tree = _strip_docstrings(parse(path.read_text(encoding="utf-8"), str(path)))
    return hashlib.sha256(ast.dump(tree, annotate_fields=True, include_attributes=False).encode()).hexdigest()


def code_digests(kind: str) -> dict[str, str]:
    """{path relative to trace_common/: source_digest} for the build code of `kind`."""
    return {rel: source_digest(PACKAGE_ROOT / rel) for rel in BUILD_CODE[kind]}


def texts_digest(texts: Iterable[str]) -> str:
    """sha256 over the texts, each length-prefixed (so no two different lists collide by concatenation)."""
    h = hashlib.sha256()
    n = 0
    for text in texts:
        raw = text.encode("utf-8")
        h.update(len(raw).to_bytes(8, "big"))
        h.update(raw)
        n += 1
    h.update(b"count:%d" % n)
    return h.hexdigest()


def examples_digest(examples: Sequence[Any]) -> str:
    """sha256 over the warm-start examples' token ids and loss masks (`sft.SFTExample`): what the
    imitation phase trains on, after tokenization."""
    h = hashlib.sha256()
    for e in examples:
        h.update(json.dumps([e.input_ids, [int(m) for m in e.loss_mask]], separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def tree_digest(root: Path = PACKAGE_ROOT) -> str:
    """sha256 over every .py and .md file under `root` (path and raw bytes), generated proto code
    excluded: the memo key of `data_digest` (a few tens of milliseconds)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".md") and "proto" not in p.parts
                       and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def data_digest(data: Any, cache_dir: Path | None, *, progress: Any = None, agent: str = ""
                ) -> tuple[str, list | None]:
    """(digest of the training conversations of `data` (a `WarmStartData`), the expert trajectories
    when they had to be played). The digest comes from the memo in `cache_dir` while the source tree
    is unchanged (trajectories None); else the expert is played (announced to `progress`, a
    `BuildProgress`, as phase "data"), and the digest memoised."""
    from trace_common.agents.data import expert_trajectories, render_texts

    key = hashlib.sha256((tree_digest() + data.model_dump_json()).encode()).hexdigest()
    memo_path = cache_dir / MEMO_NAME if cache_dir is not None else None
    memo = _read_memo(memo_path)
    if key in memo:
        return memo[key], None
    if progress is not None:
        from trace_common.agents.progress import BuildEvent

        progress(BuildEvent(agent=agent, phase="data", message=(
            f"digesting the training data: playing the scripted expert on {data.episodes} episodes "
            "(once per change of the source tree; ~12 s for 2,000 episodes here)")))
    trajectories = expert_trajectories(data)
    digest = texts_digest(render_texts(trajectories))
    if memo_path is not None:
        with _memo_lock:
            memo = _read_memo(memo_path)
            memo[key] = digest
            if len(memo) > 64:  # entries of older source trees: keep the newest
                memo = dict(list(memo.items())[-64:])
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo_path.with_name(f".{MEMO_NAME}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(json.dumps(memo, indent=1), encoding="utf-8")
            os.replace(tmp, memo_path)
    return digest, trajectories


def _read_memo(path: Path | None) -> dict[str, str]:
    if path is None or not path.is_file():
        return {}
    try:
        memo = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}  # a memo is only a shortcut: an unreadable one is recomputed
    return memo if isinstance(memo, dict) else {}


def digest_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two provenance dicts ({"config_hash", "data_digest", "code": {file: digest}}),
    one short phrase per difference; empty when they match."""
    out = []
    if recorded.get("config_hash") != current.get("config_hash"):
        out.append("another build config")
    if recorded.get("data_digest") != current.get("data_digest"):
        out.append("other training data (the domain's expert conversations changed)")
    rec_code, cur_code = recorded.get("code") or {}, current.get("code") or {}
    changed = sorted(f for f in set(rec_code) | set(cur_code) if rec_code.get(f) != cur_code.get(f))
    if changed:
        out.append("other build code (" + ", ".join(f"trace_common/{f}" for f in changed) + ")")
    return out
