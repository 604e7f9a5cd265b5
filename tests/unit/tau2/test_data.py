"""Loading tau2 data directories: tasks, splits, policy, prompts in tau2's format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_common.domains.tau2.data import load_domain, resolve_domain_dir
from trace_common.domains.tau2.prompts import AGENT_INSTRUCTION, agent_system_prompt, user_system_prompt
from trace_common.errors import InvalidArgument, NotFound

#: str(task.user_scenario) as tau2-bench renders it (from its own code), for one task per domain.
TAU2_SCENARIOS = {
    ("retail", "0"): (
        "Instructions:\n\tDomain: retail\n\tReason for call:\n\t\tYou received your order #W2378156 and wish to "
        "exchange the mechanical keyboard for the same one but with clicky switches and the smart thermostat for "
        "one compatible with Google Home instead of Apple HomeKit. If there is no keyboard that is clicky, RGB "
        "backlight, full size, you'd go for no backlight.\n\tKnown info:\n\t\tYou are Yusuf Rossi in zip code "
        "19122.\n\tUnknown info:\n\t\tYou do not remember your email address.\n\tTask instructions:\n\t\tYou are "
        "detail-oriented and want to make sure everything is addressed in one go."),
    ("airline", "0"): (
        "Instructions:\n\tDomain: airline\n\tReason for call:\n\t\tYou want to cancel reservation EHGLP3. \n\n\t\t"
        "It may be more than 24 hours after booking, but it is ok because you were out of town for that time.\n\t"
        "Known info:\n\t\tYou are Emma Kim.\n\t\tYour user id is emma_kim_9957.\n\tTask instructions:\n\t\tIf "
        "Agent tells you that cancellation is not possible,\n\t\tmention that you were told that you didn't need "
        "to get insurance because your previous trip was booked with the same agency with insurance.\n\n\t\tYou "
        "don't want to cancel if you don't get a refund."),
}


@pytest.mark.parametrize(("domain", "n_tasks", "n_train", "n_test", "has_tools"),
                         [("retail", 114, 74, 40, True), ("airline", 50, 30, 20, False)])
def test_load_domain(domain, n_tasks, n_train, n_test, has_tools, data_root):
    loaded = load_domain(data_root, domain)
    assert (loaded.name, len(loaded.tasks), loaded.has_tools) == (domain, n_tasks, has_tools)
    assert loaded.policy == (data_root / domain / "policy.md").read_text()
    splits = loaded.seed_splits()
    assert set(splits) == {"train", "test"}
    assert (len(splits["train"]), len(splits["test"])) == (n_train, n_test)
    assert not set(splits["train"]) & set(splits["test"])
    raw_ids = json.loads((data_root / domain / "split_tasks.json").read_text())
    assert [loaded.tasks[s].id for s in splits["test"]] == sorted(raw_ids["test"], key=int)
    for seed in (0, n_tasks - 1):
        assert loaded.seed_of(loaded.task_for_seed(seed).id) == seed


@pytest.mark.parametrize(("given", "domain", "expected"), [
    ("root", None, "retail"), ("root", "airline", "airline"), ("retail_dir", None, "retail"),
])
def test_resolve_domain_dir(given, domain, expected, data_root):
    path = data_root if given == "root" else data_root / "retail"
    assert resolve_domain_dir(path, domain) == data_root / expected


@pytest.mark.parametrize("seed", [-1, 114, 10_000])
def test_seed_outside_tasks_is_rejected(seed, retail):
    with pytest.raises(InvalidArgument, match="task index"):
        retail.task_for_seed(seed)


@pytest.mark.parametrize(("given", "env", "fragments"), [
    ("nowhere", None, ["{tmp}/nowhere", "TRACE_TAU2_DATA"]),            # a directory named, not there
    (None, "missing", ["{tmp}/missing", "TRACE_TAU2_DATA"]),           # the setting names one, not there
    (None, None, ["$TRACE_TAU2_DATA is unset", "--data", "retail/ and user_simulator/"]),  # nothing anywhere
])
def test_missing_data_says_where_it_looked_and_what_to_set(tmp_path, monkeypatch, given, env, fragments):
    if env is None:
        monkeypatch.delenv("TRACE_TAU2_DATA", raising=False)
    else:
        monkeypatch.setenv("TRACE_TAU2_DATA", str(tmp_path / env))
    with pytest.raises(NotFound) as err:
        load_domain(tmp_path / given if given else None)
    for fragment in fragments:
        assert fragment.format(tmp=tmp_path) in str(err.value), err.value


def _mini_domain(tmp_path: Path, data_root: Path, tasks_text: str) -> Path:
    domain = tmp_path / "retail"
    domain.mkdir()
    (domain / "policy.md").symlink_to(data_root / "retail" / "policy.md")
    (domain / "db.json").symlink_to(data_root / "retail" / "db.json")
    (domain / "tasks.json").write_text(tasks_text)
    return domain


@pytest.mark.parametrize(("tasks_text", "error", "match"), [
    ("[{", InvalidArgument, "a JSON file"),
    ('{"id": "0"}', InvalidArgument, "a JSON list of tasks"),
    ('[{"id": "0"}]', InvalidArgument, "tau2 task objects"),
])
def test_malformed_tasks_file(tasks_text, error, match, tmp_path, data_root):
    with pytest.raises(error, match=match):
        load_domain(_mini_domain(tmp_path, data_root, tasks_text))


def test_split_with_unknown_ids_is_rejected(tmp_path, data_root):
    tasks = json.loads((data_root / "retail" / "tasks.json").read_text())[:2]
    domain = _mini_domain(tmp_path, data_root, json.dumps(tasks))
    (domain / "split_tasks.json").write_text(json.dumps({"train": ["0"], "test": ["99"]}))
    with pytest.raises(InvalidArgument, match="ids present in tasks.json"):
        load_domain(domain)


@pytest.mark.parametrize(("domain", "task_id"), sorted(TAU2_SCENARIOS))
def test_user_scenario_renders_as_tau2(domain, task_id, data_root):
    task = load_domain(data_root, domain).task_by_id(task_id)
    assert task.user_scenario.render() == TAU2_SCENARIOS[(domain, task_id)]


def test_agent_system_prompt_is_tau2_format(retail):
    prompt = agent_system_prompt(retail.policy)
    assert prompt == f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{retail.policy}\n</policy>"
    assert AGENT_INSTRUCTION.startswith("You are a customer service agent that helps the user according to the "
                                        "<policy> provided below.")
    assert AGENT_INSTRUCTION.endswith("Always make sure you generate valid JSON only.")


def test_user_system_prompt_is_guidelines_then_scenario(retail, data_root):
    task = retail.task_by_id("0")
    guidelines = (data_root / "user_simulator" / "simulation_guidelines.md").read_text()
    assert user_system_prompt(retail.user_guidelines(), task) == (
        guidelines + "\n\n<scenario>\n" + TAU2_SCENARIOS[("retail", "0")] + "\n</scenario>")


def test_fresh_dbs_are_independent(retail, initial_db):
    from trace_common.domains.tau2.retail_tools import RetailTools

    a, b = retail.fresh_db(), retail.fresh_db()
    RetailTools(a).call("modify_user_address", {"user_id": "sofia_rossi_8776", "address1": "x", "address2": "",
                                                "city": "y", "state": "z", "country": "USA", "zip": "1"})
    assert a != b and b == initial_db == retail.validated_db()
    assert a.users["sofia_rossi_8776"] is not retail.pristine_db.users["sofia_rossi_8776"]


@pytest.mark.parametrize(("db_text", "match"), [
    ('{"products": {}, "users": {}, "orders": {"#W1": {"order_id": "#W1"}}}', "orders.#W1.user_id"),
    ('{"products": {}, "users": {}}', "orders"),
    ("[1, 2]", "tau2 retail db.json"),
])
def test_malformed_db_names_the_bad_field(db_text, match, tmp_path, data_root):
    domain = tmp_path / "retail"
    domain.mkdir()
    (domain / "policy.md").symlink_to(data_root / "retail" / "policy.md")
    (domain / "tasks.json").write_text("[]")
    (domain / "db.json").write_text(db_text)
    with pytest.raises(InvalidArgument, match=match):
        load_domain(domain).fresh_db()
