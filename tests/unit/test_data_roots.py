"""The operator's settings that confine request-named data: TRACE_ROLLOUT_DATA_ROOTS,
TRACE_ENVIRONMENT_DATA_ROOTS and TRACE_TRAINER_DATA_ROOTS (tau2 data directories; default $TRACE_TAU2_DATA's) and
TRACE_ANALYSIS_ROLLOUT_ROOTS (store prefixes of rollouts), as the services read them from their
environment; bad values are refused at start-up with a message saying how to write them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.analysis.settings import AnalysisSettings
from services.environment.settings import EnvironmentSettings
from services.rollout.settings import RolloutSettings
from services.trainer.settings import TrainerSettings

DATA = {"TRACE_ROLLOUT_DATA_ROOTS": RolloutSettings, "TRACE_ENVIRONMENT_DATA_ROOTS": EnvironmentSettings,
        "TRACE_TRAINER_DATA_ROOTS": TrainerSettings}


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in (*DATA, "TRACE_ANALYSIS_ROLLOUT_ROOTS", "TRACE_TAU2_DATA"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("var", list(DATA))
@pytest.mark.parametrize(("value", "tau2", "roots"), [
    (None, None, []),                                          # nothing listed: no request may name data
    (None, "/srv/tau2", ["/srv/tau2"]),                        # default: the service's own tau2 data
    ('["/a", "/b/c"]', "/srv/tau2", ["/a", "/b/c"]),           # the setting replaces the default
    ("/a:/b", None, ["/a", "/b"]),                             # os.pathsep-separated
])
def test_data_roots_are_read_from_the_environment(monkeypatch, var, value, tau2, roots):
    if value is not None:
        monkeypatch.setenv(var, value)
    if tau2 is not None:
        monkeypatch.setenv("TRACE_TAU2_DATA", tau2)
    assert DATA[var]().data_roots == [Path(r) for r in roots]


@pytest.mark.parametrize("var", list(DATA))
@pytest.mark.parametrize("value", ["relative/dir", '["/a/../b"]', "[not json", '["/ok", "./x"]'])
def test_bad_data_roots_are_refused_at_start(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValidationError, match="absolute|JSON list"):
        DATA[var]()


@pytest.mark.parametrize(("value", "roots"), [
    (None, []),
    ('["s3://shared-rollouts/team", "file:///srv/rollouts"]', ["s3://shared-rollouts/team", "file:///srv/rollouts"]),
    ("s3://shared-rollouts,file:///srv/r", ["s3://shared-rollouts", "file:///srv/r"]),
])
def test_rollout_roots_are_read_from_the_environment(monkeypatch, value, roots):
    if value is not None:
        monkeypatch.setenv("TRACE_ANALYSIS_ROLLOUT_ROOTS", value)
    assert AnalysisSettings().rollout_roots == roots


@pytest.mark.parametrize("value", ["/srv/rollouts", "s3://X_bad/r", "file://relative/x", "https://example.com/r"])
def test_bad_rollout_roots_are_refused_at_start(monkeypatch, value):
    monkeypatch.setenv("TRACE_ANALYSIS_ROLLOUT_ROOTS", value)
    with pytest.raises(ValidationError, match="rollout_roots"):
        AnalysisSettings()
