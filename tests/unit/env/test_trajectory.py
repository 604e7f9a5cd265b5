"""Trajectory records: validation and JSONL round trips."""

from __future__ import annotations

import io
import json

import pytest
from pydantic import ValidationError

from tests.unit.env.toy_env import ToyEnv
from trace_common.env import (
    Message,
    PolicyTurn,
    ToolCall,
    Trajectory,
    TurnRecord,
    dumps_jsonl,
    loads_jsonl,
    read_jsonl,
    run_episode,
    write_jsonl,
)
from trace_common.errors import ArtifactCorrupted


def _answer(messages, tools):
    a, b = (int(x) for x in messages[1].content.removeprefix("What is ").removesuffix("?").split(" + "))
    return PolicyTurn(message=Message.assistant(f"It is {a + b}."), completion_token_ids=[5, 6, 7],
                      logprobs=[-0.1, -0.2, -0.3])


def _trajectories() -> list[Trajectory]:
    return [run_episode(ToyEnv(), _answer, seed) for seed in range(3)]


def test_jsonl_round_trip_bytes_path_and_stream(tmp_path):
    trajs = _trajectories()
    assert loads_jsonl(dumps_jsonl(trajs)) == trajs
    path = tmp_path / "t.jsonl"
    assert write_jsonl(trajs, path) == 3
    assert read_jsonl(path) == trajs
    stream = io.StringIO()
    write_jsonl(trajs, stream)
    stream.seek(0)
    assert read_jsonl(stream) == trajs
    assert trajs[0].turns[0].logprobs == [-0.1, -0.2, -0.3]


@pytest.mark.parametrize("bad_line, line_no", [("{not json", 2), ('{"task_id": "1"}', 2)])
def test_corrupt_line_names_its_number(bad_line, line_no):
    good = dumps_jsonl(_trajectories()[:1]).decode()
    with pytest.raises(ArtifactCorrupted, match=f"src:{line_no}:") as err:
        loads_jsonl(good + bad_line + "\n", source="src")
    assert "\n" not in str(err.value)  # one line, whatever the parser's message looked like


@pytest.mark.parametrize("data, where", [(b"\xff\xfe\x00binary", "byte 0"), (b"ok\n\x80", "byte 3")])
def test_bytes_that_are_not_utf8_are_a_corrupted_artifact(data, where):
    with pytest.raises(ArtifactCorrupted, match=f"src: not UTF-8 text \\({where}\\)") as err:
        loads_jsonl(data, source="src")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("change, message", [
    ({"success": True, "reward": 0.5}, "success means reward == 1.0"),
    ({"reward": 1.5}, "less than or equal to 1"),
    ({"termination": "crashed"}, "termination"),
])
def test_invalid_records(change, message):
    data = _trajectories()[0].to_dict()
    data.update(change)
    with pytest.raises(ValidationError, match=message):
        Trajectory.from_dict(data)


def test_turn_record_requires_one_logprob_per_token():
    with pytest.raises(ValidationError, match="one logprob per completion token"):
        TurnRecord(message_index=2, completion_token_ids=[1, 2], logprobs=[-0.5])


def test_messages_are_stored_in_openai_shape():
    data = _trajectories()[0].to_dict()
    assert data["messages"][2] == {"role": "assistant", "content": f"It is {sum(_toy_numbers(0))}."}
    assert data["env"] == {"name": "toy", "version": "1.0.0", "params": {}}


def _toy_numbers(seed):
    env = ToyEnv()
    env.reset(seed)
    return env.a, env.b


@pytest.mark.parametrize("messages", [
    [Message.system("s"), Message.user("What is 1 + 2?"), Message.assistant("It is 3.")],
    [Message.system("s"), Message.user("naïve ünïcode ✓"),
     Message.assistant(None, [ToolCall.create("c1", "find_order", {"order_id": "#W1", "n": 2})]),
     Message.tool("c1", '{"status": "délivré"}'), Message.assistant("done", [])],
])
def test_json_line_is_the_openai_dict_form(messages):
    # to_json_line is pydantic's one-pass serialiser; it must write the dict form (OpenAI
    # messages without unset keys), compact, UTF-8 (not \u-escaped). Floats may be spelled
    # differently from json.dumps (1.2e-05 vs 0.000012): same values.
    traj = _trajectories()[0].model_copy(update={"messages": messages, "info": {"note": "é", "k": [1, 2.5]}})
    line = traj.to_json_line()
    assert json.loads(line) == traj.to_dict()
    assert "\n" not in line and "é" in line and line.startswith('{"schema_version":1,"task_id":')
    assert json.loads(line)["messages"] == [m.to_dict() for m in messages]
    assert Trajectory.from_json_line(line) == traj


def test_an_empty_tool_calls_list_is_left_out_like_none():
    # as OpenAI writes a message without calls (and as the hand-written dict form did)
    msg = Message.model_validate({"role": "assistant", "content": "no calls", "tool_calls": []})
    assert msg.to_dict() == {"role": "assistant", "content": "no calls"}
    assert json.loads(msg.model_dump_json()) == msg.to_dict()
