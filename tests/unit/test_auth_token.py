"""Auth tokens without servers: which tokens a service accepts at start-up, which `authorization`
values the shared bearer check lets through, where a client finds a service's token, and the
bound on status details (trace_common.config, trace_common.grpc.auth, trace_common.grpc.interceptors)."""

from __future__ import annotations

import importlib

import pytest
from pydantic import ValidationError

from trace_common.config import SERVICE_NAMES, check_token, service_token, token_env
from trace_common.grpc.auth import INVALID, MISSING, BearerToken
from trace_common.grpc.interceptors import MAX_DETAIL_CHARS, MAX_ECHO_CHARS, bound_detail

TOKEN = "tok-" + "a1" * 10


def _settings_class(service: str):
    mod = importlib.import_module(f"services.{service}.settings")
    return next(v for k, v in vars(mod).items() if k.endswith("Settings") and k != "ServiceSettings"
                and isinstance(v, type))


@pytest.fixture(autouse=True)
def _no_trace_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("TRACE_"):
            monkeypatch.delenv(key)


# (value of TRACE_<S>_AUTH_TOKEN, fragment of the error)
BAD_TOKENS = [
    ("", "is set but blank"),
    (" ", "is set but blank"),
    ("    ", "is set but blank"),
    ("\t\n", "is set but blank"),
    (" " + TOKEN, "leading or trailing whitespace"),
    (TOKEN + " ", "leading or trailing whitespace"),
    (TOKEN + "\n", "leading or trailing whitespace"),
    ("tok en-with-space", "visible ASCII characters without spaces"),
    ("tök-" + "x" * 20, "visible ASCII characters without spaces"),
    ("tok\x7f" + "x" * 20, "visible ASCII characters without spaces"),
    ("x" * 4097, "1..4096"),
]


@pytest.mark.parametrize("service", SERVICE_NAMES)
@pytest.mark.parametrize(("value", "fragment"), BAD_TOKENS, ids=[repr(v[0][:12]) for v in BAD_TOKENS])
def test_bad_token_is_refused_naming_the_variable(monkeypatch, service, value, fragment):
    monkeypatch.setenv(token_env(service), value)
    with pytest.raises(ValidationError) as info:
        _settings_class(service)()
    (err,) = info.value.errors()
    assert err["loc"] == ("auth_token",)
    assert fragment in err["msg"] and f"TRACE_{service.upper()}_AUTH_TOKEN" in err["msg"]
    assert value.strip() == "" or value.strip() not in err["msg"]  # the token itself is never echoed


@pytest.mark.parametrize("value", [TOKEN, "x", "A-Za-z0-9._~+/=", "x" * 4096])
@pytest.mark.parametrize("service", SERVICE_NAMES)
def test_good_token_is_kept(monkeypatch, service, value):
    monkeypatch.setenv(token_env(service), value)
    s = _settings_class(service)()
    assert s.auth_token is not None and s.auth_token.get_secret_value() == value


@pytest.mark.parametrize("service", SERVICE_NAMES)
def test_unset_token_means_no_auth(service):
    assert _settings_class(service)().auth_token is None


# (authorization value sent, refusal expected: None = accepted)
HEADERS = [
    (None, MISSING),
    (f"Bearer {TOKEN}", None),
    (f"bearer {TOKEN}", None),
    (f"BEARER   {TOKEN}", None),
    (f"Bearer {TOKEN}".encode(), None),
    ("", INVALID),
    ("Bearer", INVALID),
    ("Bearer ", INVALID),
    ("Bearer    ", INVALID),
    (TOKEN, INVALID),
    (f"Basic {TOKEN}", INVALID),
    (f"Token {TOKEN}", INVALID),
    (f"Bearer {TOKEN} ", INVALID),
    (f"Bearer {TOKEN}x", INVALID),
    (f"Bearer {TOKEN[:-1]}", INVALID),
    (f"Bearer {TOKEN.upper()}", INVALID),
    ("Bearer wrong-token", INVALID),
    (b"Bearer \xff".decode("utf-8", "surrogateescape"), INVALID),   # non-UTF-8 bytes, as aiohttp hands them over
    ("Bearer \ud800", INVALID),                                     # a lone surrogate no byte stands for
    (f"Bearer {TOKEN}\udcff", INVALID),
    (b"Bearer \xff", INVALID),
]


@pytest.mark.parametrize(("header", "refusal"), HEADERS, ids=[repr(h[0]) for h in HEADERS])
def test_bearer_check(header, refusal):
    assert BearerToken(TOKEN).refusal(header) == refusal


@pytest.mark.parametrize("token", ["", " ", " x", "x "])
def test_bearer_check_needs_a_real_token(token):
    with pytest.raises(ValueError):
        BearerToken(token)


@pytest.mark.parametrize(("env", "fallback", "expected"), [
    ({}, None, None),
    ({}, "fallback-token", "fallback-token"),
    ({"TRACE_ROLLOUT_AUTH_TOKEN": TOKEN}, None, TOKEN),
    ({"TRACE_ROLLOUT_AUTH_TOKEN": TOKEN}, "fallback-token", TOKEN),
    ({"TRACE_TRAINER_AUTH_TOKEN": TOKEN}, "fallback-token", "fallback-token"),  # another service's variable
    ({"TRACE_AUTH_TOKEN": TOKEN}, None, None),  # the stack-wide variable is the caller's fallback, not read here
])
def test_client_token_for_a_service(monkeypatch, env, fallback, expected):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert service_token("rollout", fallback) == expected


@pytest.mark.parametrize("value", ["", "   ", TOKEN + "\n"])
def test_client_refuses_a_blank_service_token(monkeypatch, value):
    monkeypatch.setenv("TRACE_INFERENCE_AUTH_TOKEN", value)
    with pytest.raises(ValueError, match="TRACE_INFERENCE_AUTH_TOKEN"):
        service_token("inference", "fallback-token")


def test_check_token_names_where_the_token_came_from():
    with pytest.raises(ValueError, match="^--token is set but blank"):
        check_token("  ", "--token")


LONG = "x" * 70_000
BOUND_CASES = [
    ("short message", "short message"),
    ("", ""),
    (f"id {'y' * (MAX_ECHO_CHARS - 2)!r}", f"id {'y' * (MAX_ECHO_CHARS - 2)!r}"),  # a 200-character run stays
    (f"id {'y' * (MAX_ECHO_CHARS - 1)!r}", f"id '{'y' * (MAX_ECHO_CHARS - 1)}..."),  # 201 are cut to 200
    (f"no job {LONG} here", f"no job {'x' * MAX_ECHO_CHARS}... here"),
    (f"a {LONG} b {LONG} c", f"a {'x' * MAX_ECHO_CHARS}... b {'x' * MAX_ECHO_CHARS}... c"),
    ("word " * 1000, ("word " * 1000)[:MAX_DETAIL_CHARS - 3] + "..."),
    ("é" * 300, "é" * MAX_ECHO_CHARS + "..."),
]


@pytest.mark.parametrize(("text", "expected"), BOUND_CASES, ids=[f"case{i}" for i in range(len(BOUND_CASES))])
def test_bound_detail(text, expected):
    got = bound_detail(text)
    assert got == expected
    assert len(got) <= MAX_DETAIL_CHARS
    assert max((len(w) for w in got.split()), default=0) <= MAX_ECHO_CHARS + 3
