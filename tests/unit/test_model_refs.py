"""`trace_common.model_refs`: the one confinement rule for model references (built-in agent, this
service's store, an operator model root; anything else PermissionDenied with one message whether the
path exists or not), and every accepted local form -> its directory (s3:// against a real S3 server:
tests/integration/test_model_refs_s3.py; over real gRPC: tests/integration/test_model_ref_confinement.py)."""

from __future__ import annotations

import pytest

from trace_common.errors import InvalidArgument, NotFound, PermissionDenied
from trace_common.model_refs import UNCONFINED, ModelRoots, check_model_ref, fetch_file, materialize


def _model_dir(root):
    d = root / "adapters" / "cap" / "v1"
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text("{}")
    (d / "config.json").write_text("{}")
    return d


@pytest.fixture
def world(tmp_path):
    """A store, an operator root, a model in each, and an attacker's directory outside both."""
    store, models, outside = tmp_path / "store", tmp_path / "models", tmp_path / "outside"
    in_store, in_root, attacker = _model_dir(store), _model_dir(models), _model_dir(outside)
    (store / "link-out").symlink_to(attacker)
    allowed = ModelRoots(store=store.as_uri(), roots=(models.as_uri(), "s3://models/base"),
                         setting="TRACE_TEST_MODEL_ROOTS")
    return dict(store=store, models=models, in_store=in_store, in_root=in_root, attacker=attacker,
                allowed=allowed, tmp=tmp_path)


@pytest.mark.parametrize("form", ["uri", "abs", "uri+file", "abs+file", "dotdot-inside"])
@pytest.mark.parametrize("where", ["in_store", "in_root"])
def test_references_under_the_store_or_a_root_resolve_to_the_directory(world, form, where):
    d = world[where]
    ref = {"uri": d.as_uri(), "abs": str(d), "uri+file": d.as_uri() + "/adapter_model.safetensors",
           "abs+file": str(d) + "/adapter_config.json", "dotdot-inside": f"{d}/../v1"}[form]
    assert materialize(ref, allowed=world["allowed"]) == d.resolve()
    check_model_ref(ref, allowed=world["allowed"])


@pytest.mark.parametrize("ref", [
    "{attacker}",                                # an absolute path outside
    "file://{attacker}",                         # the same as a URI
    "{store}/../outside/adapters/cap/v1",        # `..` out of the store
    "{models}/../outside/adapters/cap/v1",       # `..` out of a root
    "{store}/link-out",                          # a symlink in the store pointing out of it
    "{tmp}/models-evil/x",                       # a sibling whose name starts like a root
    "{tmp}/nowhere/at/all",                      # a path that does not exist
    "/etc",                                      # a system directory
    "s3://other-bucket/base/m",                  # another bucket
    "s3://models/base/../secret/m",              # `..` out of an s3 root
    "s3://models/basement/m",                    # a prefix that only starts like the root
    "http://example.com/m",                      # another scheme
    "nano",                                      # not a built-in agent
])
def test_references_outside_are_refused_with_one_message(world, ref):
    ref = ref.format(**{k: str(v) for k, v in world.items() if k != "allowed"})
    messages = set()
    for check in (lambda: materialize(ref, allowed=world["allowed"], field="policy.model"),
                  lambda: check_model_ref(ref, "policy.model", allowed=world["allowed"])):
        with pytest.raises(PermissionDenied) as err:
            check()
        messages.add(str(err.value))
    (message,) = messages
    assert message.startswith("policy.model: ") and "TRACE_TEST_MODEL_ROOTS" in message
    assert world["store"].as_uri() in message and world["models"].as_uri() in message
    # the message is the same whether the path exists: it differs from another ref's only by the ref
    other = "/no/such/dir/at/all"
    with pytest.raises(PermissionDenied) as err2:
        check_model_ref(other, "policy.model", allowed=world["allowed"])
    assert message.replace(repr(ref), "X") == str(err2.value).replace(repr(other), "X")
    assert "link-out" not in message.replace(repr(ref), "") and str(world["attacker"]) not in \
        message.replace(repr(ref), "")


def test_an_existing_and_a_missing_outside_path_get_the_same_answer(world):
    exists, missing = str(world["attacker"]), str(world["tmp"] / "outside" / "adapters" / "cap" / "v9")
    texts = []
    for ref in (exists, missing):
        with pytest.raises(PermissionDenied) as err:
            check_model_ref(ref, allowed=world["allowed"])
        texts.append(str(err.value).replace(repr(ref), "REF"))
    assert texts[0] == texts[1]


def test_the_default_rule_allows_built_in_agents_only(world):
    check_model_ref("micro", allowed=ModelRoots())
    with pytest.raises(PermissionDenied, match="none listed"):
        check_model_ref(str(world["in_root"]), allowed=ModelRoots())


@pytest.mark.parametrize("ref, error, text", [
    ("", InvalidArgument, "policy.model"),
    ("{models}/not/there", NotFound, "is not a directory"),       # allowed, then looked at
])
def test_allowed_but_bad_references_name_the_field(world, ref, error, text):
    ref = ref.format(models=world["models"])
    with pytest.raises(error, match=text) as err:
        materialize(ref, allowed=world["allowed"], field="policy.model")
    assert "policy.model" in str(err.value)


def test_check_model_ref_looks_for_the_marker_file_only_when_allowed(world):
    with pytest.raises(NotFound, match="no adapter_config.json"):
        check_model_ref(str(world["models"]), allowed=world["allowed"], marker="adapter_config.json")
    check_model_ref(str(world["in_root"]), allowed=world["allowed"], marker="adapter_config.json")


def test_fetch_file_reads_through_the_store_verified(world, tmp_path):
    from trace_common.artifacts import open_store
    from trace_common.errors import ArtifactCorrupted

    store = open_store(world["store"].as_uri())
    info = store.put_bytes("runs/r/moe/gates.safetensors", b"gates")
    got = fetch_file(info.uri, tmp_path / "cache", allowed=world["allowed"])
    assert got.read_bytes() == b"gates"
    (world["store"] / "runs/r/moe/gates.safetensors").write_bytes(b"other")  # behind the store's back
    with pytest.raises(ArtifactCorrupted):
        fetch_file(info.uri, tmp_path / "cache2", allowed=world["allowed"])
    bare = world["models"] / "gates.safetensors"   # no sha256 sidecar: not an artifact, never used in place
    bare.write_bytes(b"gates")
    with pytest.raises(ArtifactCorrupted, match="no valid sha256"):
        fetch_file(bare.as_uri(), tmp_path / "cache3", allowed=world["allowed"])
    with pytest.raises(PermissionDenied, match="gates_uri"):
        fetch_file("/etc/passwd", tmp_path / "cache4", allowed=world["allowed"])


def test_unconfined_is_for_trusted_callers(tmp_path):
    d = _model_dir(tmp_path)
    assert materialize(str(d), allowed=UNCONFINED) == d.resolve()


@pytest.mark.parametrize(("value", "expected"), [
    ('["/models", "s3://models/base/"]', ["file:///models", "s3://models/base"]),   # a JSON list
    ("/models, file:///srv/m/", ["file:///models", "file:///srv/m"]),               # comma-separated
    ("", []),
    ("models/relative", ValueError),                                                 # not absolute
    ("http://example.com/m", ValueError),
    ('["/models"', ValueError),                                                      # bad JSON
])
def test_the_model_roots_setting(monkeypatch, value, expected):
    from pydantic import ValidationError

    from trace_common.config import settings_class

    monkeypatch.setenv("TRACE_ROLLOUT_MODEL_ROOTS", value)
    monkeypatch.setenv("TRACE_ROLLOUT_S3_ENDPOINT", "minio:9000")
    if expected is ValueError:
        with pytest.raises(ValidationError, match="model_roots|model root"):
            settings_class("rollout")()
        return
    settings = settings_class("rollout")()
    assert settings.model_roots == expected
    assert ModelRoots.of(settings).setting == "TRACE_ROLLOUT_MODEL_ROOTS"


def test_s3_model_roots_need_the_s3_server(monkeypatch):
    from pydantic import ValidationError

    from trace_common.config import settings_class

    monkeypatch.delenv("TRACE_ROLLOUT_S3_ENDPOINT", raising=False)
    monkeypatch.setenv("TRACE_ROLLOUT_MODEL_ROOTS", "s3://models/base")
    with pytest.raises(ValidationError, match="TRACE_ROLLOUT_S3_ENDPOINT"):
        settings_class("rollout")()
