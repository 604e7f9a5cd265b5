"""tracectl's bad-input paths that need no server: each is exit status 2 (tracectl/exits.py) with one
line naming the flag and no traceback, before any work starts.

Below: whole-number flags out of range (argparse refuses them while parsing), flags checked by the
command (serve / route-trace, which used to `raise SystemExit("...")`, exit 1), a JSON input nested
past the parser's recursion limit, an artifact store or cache directory that cannot be one, the
`--composition` of a bare file name, and the exit-status epilog of every command's --help.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from tracectl.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]

#: (argv, the flag the one-line error must name)
OUT_OF_RANGE = [
    (["agents", "verify", "micro", "--steps", "0"], "--steps"),
    (["agents", "verify", "micro", "--steps", "-3"], "--steps"),
    (["agents", "ship", "micro", "--steps", "0"], "--steps"),
    (["rollout", "--limit", "-1"], "--limit"),
    (["rollout", "--samples", "0"], "--samples"),
    (["rollout", "--samples", str(1 << 31)], "--samples"),          # past int32: protobuf raised ValueError
    (["rollout", "--concurrency", "-2"], "--concurrency"),
    (["rollout", "--max-turns", "-1"], "--max-turns"),
    (["rollout", "--seed", str(1 << 63)], "--seed"),                # past int64
    (["analyze", "r.jsonl", "--runs", "-1"], "--runs"),
    (["analyze", "r.jsonl", "--budget", "-5"], "--budget"),
    (["analyze", "r.jsonl", "--max-candidates", "-1"], "--max-candidates"),
    (["envs", "generate", "--max-retries", "-1"], "--max-retries"),
    (["route-trace", "--max-tokens", "0"], "--max-tokens"),
    (["serve", "--port", "-1"], "--port"),
    (["serve", "--http-port", "65536"], "--http-port"),
    (["serve", "--metrics-port", "70000"], "--metrics-port"),
]


@pytest.mark.parametrize("argv, flag", OUT_OF_RANGE, ids=[" ".join(a) for a, _ in OUT_OF_RANGE])
def test_a_whole_number_flag_out_of_range_is_refused_while_parsing(capsys, argv, flag):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(argv)   # parsing only: on a refusal nothing runs
    err = capsys.readouterr().err
    assert stop.value.code == 2
    last = err.strip().splitlines()[-1]
    assert f"argument {flag}: expected a whole number" in last and "Traceback" not in err, err


@pytest.mark.parametrize("steps", ["0", "-3"])
def test_agents_verify_with_no_steps_does_no_work(monkeypatch, capsys, steps):
    """It used to replay the build for ~40 s, then die of ZeroDivisionError."""
    from trace_common.agents import shipped

    def no_work(*_a, **_k):
        raise AssertionError("shipped.check ran: --steps was not refused before any work")

    monkeypatch.setattr(shipped, "check", no_work)
    with pytest.raises(SystemExit) as stop:
        main(["agents", "verify", "micro", "--steps", steps])
    assert stop.value.code == 2
    assert "argument --steps" in capsys.readouterr().err


def test_the_flags_accept_their_documented_values():
    ns = build_parser().parse_args(["rollout", "--limit", "0", "--samples", "1", "--concurrency", "0",
                                    "--seed", "-7"])
    assert (ns.limit, ns.samples, ns.concurrency, ns.seed) == (0, 1, 0, -7)
    assert build_parser().parse_args(["serve", "--port", "0", "--http-port", "65535"]).http_port == 65535
    assert build_parser().parse_args(["agents", "verify", "micro", "--steps", "1"]).steps == 1


def _one_line(capsys, code: int, flag: str) -> str:
    out, err = capsys.readouterr()
    text = out + err
    assert code == 2, text
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if flag in line]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def no_inference_env(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich would wrap the one line
    for var in ("TRACE_INFERENCE_TARGET", "TRACE_INFERENCE_AUTH_TOKEN", "TRACE_AUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)


#: (argv, environment, flag named, fragment): refused by serve / route-trace before anything starts
COMMAND_CHECKS = [
    (["serve", "--once"], {}, "--composition / --base", "expected one of them"),
    (["serve", "--base", "micro", "--adapter", "foo", "--once"], {}, "--adapter", "expected NAME=URI"),
    (["serve", "--base", "micro", "--target", "foo=bar:1"], {}, "--target", "[inference=]HOST:PORT"),
    (["serve", "--base", "micro"], {"TRACE_INFERENCE_TARGET": "foo=bar:1"}, "TRACE_INFERENCE_TARGET",
     "[inference=]HOST:PORT"),
    (["serve", "--base", "micro", "--token=", "--once"], {}, "--token", "blank"),
    (["serve", "--base", "micro", "--token", " tok ", "--once"], {}, "--token", "whitespace"),
    (["serve", "--base", "micro", "--once"], {"TRACE_AUTH_TOKEN": ""}, "TRACE_AUTH_TOKEN", "blank"),
    (["serve", "--base", "micro", "--port", "18123", "--http-port", "18123", "--once"], {}, "--http-port 18123",
     "--port and --http-port are both 18123"),
    (["serve", "--base", "micro", "--http-port", "18124", "--metrics-port", "18124", "--once"], {},
     "--metrics-port 18124", "--http-port and --metrics-port are both 18124"),
    (["route-trace", "--target", "127.0.0.1:1"], {}, "--message / --messages-file", "expected one of them"),
    (["route-trace", "--target", "127.0.0.1:1", "--message", "hi", "--token="], {}, "--token", "blank"),
]


@pytest.mark.parametrize("argv, env, flag, fragment", COMMAND_CHECKS, ids=[" ".join(c[0]) for c in COMMAND_CHECKS])
def test_serve_and_route_trace_refuse_a_bad_flag_with_exit_2(tmp_path, monkeypatch, capsys, no_inference_env,
                                                             argv, env, flag, fragment):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.chdir(tmp_path)
    line = _one_line(capsys, main([*argv, "--root", str(tmp_path / "root")]), flag)
    assert fragment in line, line
    assert not (tmp_path / "root").exists()            # nothing started: no store


def test_route_trace_refuses_messages_that_are_not_chat_messages(tmp_path, capsys, no_inference_env):
    conv = tmp_path / "conv.json"
    conv.write_text("[1, 2]")
    line = _one_line(capsys, main(["route-trace", "--messages-file", str(conv), "--target", "127.0.0.1:1"]),
                     "--messages-file")
    assert "a JSON list of chat messages" in line


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_a_json_file_nested_past_the_recursion_limit_is_one_line(tmp_path, capsys, no_inference_env, opening):
    deep = tmp_path / "deep.json"
    deep.write_text(opening * 100_000)                 # 100k levels: json.loads raised RecursionError
    line = _one_line(capsys, main(["route-trace", "--messages-file", str(deep), "--target", "127.0.0.1:1"]),
                     "--messages-file")
    assert "nested too deeply" in line and str(deep) in line


def test_every_reader_refuses_deep_nesting(tmp_path):
    from trace_common.errors import InvalidArgument
    from tracectl.inputs import check_jsonl, read_json

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(InvalidArgument, match="--config .*nested too deeply"):
        read_json(deep, "--config", dict)
    with pytest.raises(InvalidArgument, match="line 1 is nested too deeply"):
        check_jsonl(deep, "rollout")


def _directories(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (a path that cannot be a writable directory, what the message says)."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    return {"a file": (afile, "it is a file, not a directory"),
            "under a file": (afile / "sub", "cannot create this directory (Not a directory)"),
            "in /proc": (Path("/proc/trace-no-such-dir"), "cannot create this directory")}


@pytest.mark.parametrize("kind", ["a file", "under a file", "in /proc"])
@pytest.mark.parametrize("command", ["up", "serve", "agents", "agents by env", "run"])
def test_a_directory_flag_that_cannot_be_a_directory_is_one_line(tmp_path, monkeypatch, capsys, no_inference_env,
                                                                 command, kind):
    path, fragment = _directories(tmp_path)[kind]
    if command.startswith("agents"):   # it used to digest the training data (~12 s) first, then raise FileExistsError
        from trace_common.agents import resolve as resolve_module

        monkeypatch.setattr(resolve_module, "provenance_of",
                            lambda *a, **k: (_ for _ in ()).throw(AssertionError("work started")))
    config = tmp_path / "run.yaml"   # `tracectl run` takes its store root from the config, and names that field
    config.write_text(yaml.safe_dump({**yaml.safe_load((REPO / "examples" / "quick.yaml").read_text()),
                                      "store": {"root": f"file://{path}"}}))
    argv, flag = {"up": (["up", "--once", "--root", str(path)], "--root"),
                  "run": (["run", "--config", str(config)], "store.root"),
                  "serve": (["serve", "--base", "micro", "--once", "--root", str(path)], "--root"),
                  "agents": (["agents", "build", "micro", "--cache-dir", str(path)], "--cache-dir"),
                  "agents by env": (["agents", "build", "micro"], "TRACE_AGENT_CACHE")}[command]
    monkeypatch.setenv("TRACE_AGENT_CACHE", str(path if command == "agents by env" else tmp_path / "agents"))
    line = _one_line(capsys, main(argv), f"{flag} {path}")
    assert fragment in line and "this user can write" in line, line


@pytest.mark.parametrize("directory, name", [
    ("moe", "moe"),                       # the composition's directory names it
    ("my run", "composition"),            # ... unless that is no valid name (trace_common.specs.COMPOSITION_NAME_RE)
    ("_hidden", "composition"),
])
def test_serve_reads_a_composition_given_by_a_bare_file_name(tmp_path, monkeypatch, directory, name):
    """`--composition composition.json` was refused as 'not a model location ... (unconfined)'."""
    from trace_common.artifacts import open_store
    from tracectl.commands.serve import composition_spec

    manifest = {"format": "trace-moe-composition/v1", "base_model": "micro",
                "adapters": [{"name": "refunds", "uri": "file:///abs/adapters/refunds/v1"}],
                "gates_uri": "file:///abs/moe/gates.safetensors", "hidden_size": 8, "num_layers": 2,
                "num_slots": 2, "gate_parameters": 36}
    open_store(tmp_path.as_uri()).put_bytes(f"{directory}/composition.json", json.dumps(manifest).encode())
    monkeypatch.chdir(tmp_path / directory)
    args = argparse.Namespace(composition="composition.json", base="", adapter=[], gates="")
    spec = composition_spec(args, "")
    assert (spec.name, spec.base_model, [a.name for a in spec.adapters]) == (name, "micro", ["refunds"])


def test_serve_names_what_to_pass_for_a_composition_it_cannot_read(tmp_path, capsys, no_inference_env):
    line = _one_line(capsys, main(["serve", "--composition", "http://example.invalid/composition.json", "--once",
                                   "--root", str(tmp_path / "root")]), "--composition")
    assert "the path of a composition.json" in line and "(unconfined)" not in line, line


def _subparsers(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:  # noqa: SLF001 -- argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", sub
                yield from _subparsers(sub, f"{prefix}{name} ")


COMMANDS = [name for name, _ in _subparsers(build_parser())]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_lists_its_exit_statuses(command):
    """README: "`--help` lists the rows that apply" -- for every command, 0, 2 and 130 at least."""
    sub = dict(_subparsers(build_parser()))[command]
    text = sub.format_help()
    assert "exit status:" in text, text
    rows = text.split("exit status:", 1)[1]
    for code in ("0", "2", "130"):
        assert f"\n  {code} " in rows, rows


def test_the_commands_are_all_checked():
    assert {"up", "status", "serve", "route-trace", "agents", "tau2", "tau2 replay-gold", "run", "rollout"} <= set(
        COMMANDS)


@pytest.mark.parametrize("flag, fix, said", [
    ("store.root", "", "Give store.root a directory this user can write"),   # `tracectl run` on a file:// store
    ("the embedded services' state directory", "Remove or rename it", "Remove or rename it"),   # ... on s3://
])
def test_an_embedded_stack_names_its_root_as_the_command_chose_it(tmp_path, flag, fix, said):
    """Refused before any service starts, naming the root as the command's user knows it."""
    from trace_common.errors import InvalidArgument
    from tracectl.connect import Connection

    afile = tmp_path / "afile"
    afile.write_text("x")
    args = argparse.Namespace(target=[], token=None, root=afile, root_flag=flag, root_fix=fix)
    with Connection(args) as conn, pytest.raises(InvalidArgument) as refused:
        conn.stub("rollout")
    assert f"{flag} {afile}: it is a file, not a directory" in str(refused.value) and said in str(refused.value)
