"""A writer of the file backend killed (SIGKILL) at any point of a write leaves the key readable as
its previous version or as the new one, never new bytes beside the old digest (what made
`runs/<id>/manifest.json` read as "damaged" after a killed stage transition).

Each case forks a child that writes the key with `os.replace` instrumented to SIGKILL the child
before or after its n-th call (the renames that publish a write), then checks, in the parent,
everything a later process sees: every reader, `stat`, `exists`, `list`, and that the next write
settles the record (one `sha256sum` line that `sha256sum -c` accepts).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from trace_common.artifacts import open_store
from trace_common.errors import ArtifactCorrupted, NotFound

KEY = "runs/r1/manifest.json"
OLD = b'{"stages": {"rollout": "completed"}}'
MID = b'{"stages": {"rollout": "completed", "analysis": "running"}}'
NEW = b'{"stages": {"rollout": "completed", "analysis": "completed"}}'
ABSENT, DAMAGED = "absent", "damaged"

#: (when, n): SIGKILL the writer before or after its n-th os.replace. A write renames at most 3 times,
#: so ("after", 3) and ("after", 4) let it finish.
CRASH_POINTS = [("before", 1), ("after", 1), ("before", 2), ("after", 2), ("before", 3), ("after", 3), ("after", 4)]


def _killed_write(root: Path, key: str, data: bytes, when: str, n: int) -> bool:
    """put_bytes(key, data) in a child SIGKILLed before/after its n-th os.replace; True if it was killed."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            real, calls = os.replace, [0]

            def replace(src, dst, **kw):
                calls[0] += 1
                if calls[0] == n and when == "before":
                    os.kill(os.getpid(), signal.SIGKILL)
                real(src, dst, **kw)
                if calls[0] == n and when == "after":
                    os.kill(os.getpid(), signal.SIGKILL)

            os.replace = replace
            open_store(root.as_uri()).put_bytes(key, data)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _state(store, key: str, tmp_path: Path) -> bytes | str:
    """What every reader sees: the bytes, ABSENT or DAMAGED; the readers and metadata must agree."""
    try:
        data = store.get_bytes(key)
    except NotFound:
        for read in (lambda: store.get_file(key, tmp_path / "dl"), lambda: list(store.iter_chunks(key)), lambda: store.stat(key)):
            with pytest.raises(NotFound):
                read()
        assert not store.exists(key) and key not in [i.key for i in store.list()]
        return ABSENT
    except ArtifactCorrupted:
        return DAMAGED
    store.get_file(key, tmp_path / "dl")
    assert (tmp_path / "dl").read_bytes() == data and b"".join(store.iter_chunks(key, chunk_size=7)) == data
    digest = hashlib.sha256(data).hexdigest()
    info = store.stat(key)
    assert (info.sha256, info.size) == (digest, len(data))
    assert [i for i in store.list("runs/") if i.key == key] == [info]
    assert store.exists(key)
    return data


def _settles(store, root: Path, key: str, tmp_path: Path) -> None:
    """The next write of the key leaves one intact version with a one-line record and no temp files."""
    info = store.put_bytes(key, b"after the crash")
    assert _state(store, key, tmp_path) == b"after the crash" and store.stat(key) == info
    directory = root / os.path.dirname(key)
    sidecar = (directory / (os.path.basename(key) + ".sha256")).read_text()
    assert sidecar == f"{info.sha256}  {os.path.basename(key)}\n"
    check = subprocess.run(["sha256sum", "-c", sidecar.split()[1] + ".sha256"], cwd=directory, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def _prepare(store, root: Path, history: list) -> None:
    """Bring the key to a starting state: `history` is a list of (data, crash point or None)."""
    for data, crash in history:
        if crash is None:
            store.put_bytes(KEY, data)
        else:
            assert _killed_write(root, KEY, data, *crash)


#: (starting state, its history, the outcomes a killed write of NEW may leave)
SCENARIOS = [
    ("first write", [], {ABSENT, NEW}),
    ("overwrite", [(OLD, None)], {OLD, NEW}),
    ("same bytes again", [(NEW, None)], {NEW}),
    # an earlier overwrite killed after its first rename: OLD's bytes under a record of MID and OLD
    ("after a write killed at step 1", [(OLD, None), (MID, ("after", 1))], {OLD, NEW}),
    # ... killed after its second rename: MID's bytes under the record of MID and OLD
    ("after a write killed at step 2", [(OLD, None), (MID, ("after", 2))], {MID, NEW}),
    ("after a killed first write", [(MID, ("after", 1))], {ABSENT, NEW}),
    # bytes put there behind the store's back (no record): unreadable before, so damaged or NEW after
    ("over bytes with no record", [(OLD, "unrecorded")], {DAMAGED, NEW}),
]


@pytest.mark.parametrize(("when", "n"), CRASH_POINTS, ids=[f"{w}-replace-{n}" for w, n in CRASH_POINTS])
@pytest.mark.parametrize(("start", "history", "allowed"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_a_killed_write_leaves_the_old_or_the_new_version(tmp_path, start, history, allowed, when, n):
    root = tmp_path / "store"
    store = open_store(root.as_uri())
    if history and history[0][1] == "unrecorded":
        (root / os.path.dirname(KEY)).mkdir(parents=True)
        (root / KEY).write_bytes(history[0][0])
    else:
        _prepare(store, root, history)
    before = _state(store, KEY, tmp_path)
    assert before in allowed | {ABSENT, DAMAGED}

    _killed_write(root, KEY, NEW, when, n)

    after = _state(store, KEY, tmp_path)
    assert after in allowed, f"{start}, killed {when} rename {n}: read {after!r}, allowed {allowed}"
    assert after in (before, NEW)
    _settles(store, root, KEY, tmp_path)


def test_the_crash_points_reach_both_outcomes(tmp_path):
    """The table above does kill writers between their renames: an overwrite killed early reads as
    the old version, one killed late as the new one (and the old code failed the middle ones)."""
    seen = {}
    for when, n in CRASH_POINTS:
        root = tmp_path / f"{when}{n}"
        store = open_store(root.as_uri())
        store.put_bytes(KEY, OLD)
        killed = _killed_write(root, KEY, NEW, when, n)
        seen[(when, n)] = (killed, _state(store, KEY, tmp_path))
    assert seen[("before", 1)] == (True, OLD)
    assert seen[("after", 1)] == (True, OLD)  # the record of both versions is in place, the bytes are old
    assert seen[("after", 2)] == (True, NEW)  # the new bytes are in place, the record still names both
    assert seen[("after", 4)] == (False, NEW)


def test_a_write_killed_between_its_renames_does_not_damage_a_run_manifest(tmp_path):
    """The reviewer's reproduction (a stage transition's manifest rewrite SIGKILLed right after the
    data rename), at the store level: the manifest still parses as one of its two versions."""
    root = tmp_path / "store"
    store = open_store(root.as_uri())
    store.put_bytes(KEY, OLD)
    for n in (1, 2):
        _killed_write(root, KEY, NEW, "after", n)
        assert json.loads(store.get_bytes(KEY))["stages"]["rollout"] == "completed"
