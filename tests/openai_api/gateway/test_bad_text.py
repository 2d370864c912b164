"""Text PostgreSQL cannot keep (NUL, lone surrogates), everywhere a client sends text to the
gateway and its batch API: a 400 naming the field, never a 500 or an HTML page. And every
``/v1/`` answer is OpenAI-style JSON: unknown paths, wrong methods, a bad Host, a view that
breaks (with DEBUG on too).

Lone surrogates cannot be encoded in UTF-8, so they are sent as the JSON escape ``\\ud800`` in
the raw body; NUL is sent as ``\\u0000`` in JSON and as ``%00`` in paths and query strings.
"""

from __future__ import annotations

import json
from http import HTTPStatus

import httpx
import pytest

from openai_api.models import BatchJob
from tests.openai_api.batches.batch_helpers import (
    batch_queue,  # noqa: F401 (fixture)
    completion_line,
    jsonl,
    prompt_of,
)

NUL = "\\u0000"  # JSON escapes, written into raw bodies as they are
SURROGATE = "\\ud800"
LOW_SURROGATE = "\\udfff"
BAD = [NUL, SURROGATE, LOW_SURROGATE]


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} | (
        {"lines", "bad_lines"} if error.get("code") == "invalid_batch_input" else set()
    )
    return error


def raw_json(template: str, escape: str) -> bytes:
    """``template`` with ``{bad}`` replaced by a JSON escape, as bytes (the escape stays an
    escape: the bytes are plain ASCII)."""
    return template.replace("{bad}", escape).encode()


# --- the completion endpoints -----------------------------------------------------------------


@pytest.mark.parametrize("escape", BAD)
@pytest.mark.parametrize(
    ("endpoint", "template", "param"),
    [
        ("/v1/chat/completions", '{"model": "org/m{bad}", "messages": []}', "model"),
        ("/v1/completions", '{"model": "{bad}", "prompt": "x"}', "model"),
        (
            "/v1/chat/completions",
            '{"model": "m", "messages": [{"role": "user", "content": "a{bad}"}]}',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            '{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", '
            '"text": "{bad}"}]}]}',
            "messages[0].content[0].text",
        ),
        ("/v1/completions", '{"model": "m", "prompt": ["{bad}"]}', "prompt[0]"),
        ("/v1/completions", '{"model": "m", "prompt": "x", "stop": ["{bad}"]}', "stop[0]"),
        ("/v1/completions", '{"model": "m", "prompt": "x", "user": "{bad}"}', "user"),
        ("/v1/completions", '{"model": "m", "prompt": "x", "bid": "1{bad}"}', "bid"),
        ("/v1/completions", '{"model": "m", "prompt": "x", "x{bad}": 1}', None),
    ],
)
def test_bad_text_in_a_completion_body_is_400_naming_the_field(
    gateway, acme, endpoint, template, param, escape
):
    with acme.http(gateway) as http:
        response = http.post(
            endpoint,
            content=raw_json(template, escape),
            headers={"Content-Type": "application/json"},
        )
        error = error_of(response, 400)
    assert error["param"] == param
    assert ("NUL" if escape == NUL else "surrogate") in error["message"]


def test_json_nested_too_deep_is_400_naming_the_field(gateway, acme):
    deep = "[" * 40 + "]" * 40  # well under json's own limit, over the gateway's (32)
    body = f'{{"model": "m", "prompt": "x", "user": {deep}}}'.encode()
    with acme.http(gateway) as http:
        error = error_of(http.post("/v1/completions", content=body), 400)
    assert error["param"].startswith("user")
    assert "nested deeper" in error["message"]


@pytest.mark.parametrize(
    "template",
    [
        '{"model": "m", "messages": [{"role": "user", "content": "x"}], "user": DEEP}',
        "DEEP",
        '{"model": "m", "messages": DEEP}',
    ],
)
def test_json_nested_past_the_parsers_own_limit_is_400_in_the_gateways_words(
    gateway, acme, template
):
    """10,000 levels: Python's parser gives up ("maximum recursion depth exceeded"); the
    answer says what the gateway's limit is instead."""
    deep = "[" * 10_000 + "]" * 10_000
    body = template.replace("DEEP", deep).encode()
    with acme.http(gateway) as http:
        error = error_of(http.post("/v1/chat/completions", content=body), 400)
    assert error["type"] == "invalid_request_error" and error["code"] == "malformed_request"
    assert error["message"] == "the body is nested deeper than 32 arrays or objects"
    assert error["param"] is None


@pytest.mark.parametrize(
    ("endpoint", "template", "param"),
    [
        ("/v1/chat/completions", '{"model": "m", "messages": MSGS, "max_tokens": N}', "max_tokens"),
        ("/v1/chat/completions", '{"model": "m", "messages": MSGS, "bid": -N}', "bid"),
        ("/v1/chat/completions", '{"model": "m", "messages": MSGS, "n": N}', "n"),
        ("/v1/completions", '{"model": "m", "prompt": [1, 2, N]}', "prompt[2]"),
        (
            "/v1/completions",
            '{"model": "m", "prompt": "x", "metadata": {"a": [N]}}',
            "metadata.a[0]",
        ),
    ],
)
def test_an_integer_too_long_to_read_is_400_naming_the_field(
    gateway, acme, endpoint, template, param
):
    """5,000 digits: Python refuses to read the integer ("Exceeds the limit (4300 digits)");
    the answer names the field instead."""
    messages = json.dumps([{"role": "user", "content": "x"}])
    body = template.replace("MSGS", messages).replace("N", "9" * 5000).encode()
    with acme.http(gateway) as http:
        error = error_of(http.post(endpoint, content=body), 400)
    assert error["type"] == "invalid_request_error" and error["code"] == "malformed_request"
    assert error["message"] == f"{param} has too many digits (5000) for any number the API takes"
    assert error["param"] == param


# --- the batch API ----------------------------------------------------------------------------


def good_line(custom_id: str = "q0") -> dict:
    return completion_line(custom_id, "org/m", prompt=prompt_of(0, 3), max_tokens=2, bid=0.01)


def line_with(field: str, escape: str) -> str:
    """A batch line whose ``field`` holds bad text (the JSON escape, as written)."""
    line = good_line()
    placeholder = "PLACEHOLDER"
    if field == "custom_id":
        line["custom_id"] = placeholder
    else:
        line["body"][field.removeprefix("body.")] = placeholder
    return json.dumps(line).replace(placeholder, f"a{escape}")


@pytest.mark.usefixtures("batch_queue")
@pytest.mark.parametrize("escape", BAD)
@pytest.mark.parametrize("field", ["custom_id", "body.model", "body.prompt", "body.user"])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_batch_line_with_bad_text_is_refused_whole(gateway, acme, field, escape, as_json):
    text = jsonl([good_line("first")]) + line_with(field, escape) + "\n"
    with acme.http(gateway) as http:
        if as_json:  # {"input": "<jsonl>"}: the escapes are inside the JSONL text itself
            response = http.post("/v1/batches", json={"input": text})
        else:
            response = http.post(
                "/v1/batches", content=text, headers={"Content-Type": "application/jsonl"}
            )
        error = error_of(response, 400)
    assert error["code"] == "invalid_batch_input"
    assert error["param"] == field
    assert [(e["line"], e["param"]) for e in error["lines"]] == [(2, field)]
    assert not BatchJob.objects.exists()


@pytest.mark.usefixtures("batch_queue")
@pytest.mark.parametrize("escape", BAD)
@pytest.mark.parametrize(
    ("template", "param"),
    [
        ('{"input": "{bad}"}', "input"),
        ('{"input": "a{bad}b"}', "input"),
        ('{"input": %s, "metadata": {"team": "{bad}"}}', "metadata.team"),
        ('{"input": %s, "metadata": {"t{bad}": "x"}}', "metadata"),
    ],
)
def test_bad_text_in_a_batch_input_or_its_metadata_is_400(gateway, acme, template, param, escape):
    if "%s" in template:
        template = template % json.dumps(jsonl([good_line()]))
    with acme.http(gateway) as http:
        response = http.post(
            "/v1/batches",
            content=raw_json(template, escape),
            headers={"Content-Type": "application/json"},
        )
        error = error_of(response, 400)
    assert error["param"] == param
    assert not BatchJob.objects.exists()


@pytest.mark.parametrize(
    ("method", "path", "param"),
    [
        ("GET", "/v1/batches?after=%00", "after"),
        ("GET", "/v1/batches?after=batch_%00x", "after"),
        ("GET", "/v1/batches/%00", "batch_id"),
        ("GET", "/v1/batches/batch_%00", "batch_id"),
        ("POST", "/v1/batches/%00/cancel", "batch_id"),
        ("GET", "/v1/batches/%00/output", "batch_id"),
        ("GET", "/v1/batches/%00/errors", "batch_id"),
    ],
)
def test_nul_in_a_batch_path_or_query_is_400_naming_it(gateway, acme, method, path, param):
    with acme.http(gateway) as http:
        error = error_of(http.request(method, path), 400)
    assert error["param"] == param


# 4,301 digits: past Python's integer-conversion limit (issue 30: a 500 internal_error).
@pytest.mark.parametrize("limit", ["١٠", "１０", "1_0", "+5", " 5", "%00", "9" * 4301, "0" * 4301])
def test_batch_list_limit_is_ascii_digits_only(gateway, acme, limit):
    with acme.http(gateway) as http:
        error = error_of(http.get(f"/v1/batches?limit={limit}"), 400)
    assert error["param"] == "limit"


# --- every /v1 answer is JSON -----------------------------------------------------------------


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/no-such-endpoint", 404),
        ("POST", "/v1/chat/completions/extra", 404),
        ("GET", "/v1/batches/batch_x/output/more", 404),
        ("GET", "/v1/models/", 404),
        ("GET", "/v1/%00", 404),
        ("GET", "/v1/chat/completions", 405),
        ("PUT", "/v1/batches", 405),
        ("DELETE", "/v1/batches/batch_x", 405),
        ("GET", "/v1/batches/batch_x/cancel", 405),
    ],
)
def test_unknown_paths_and_wrong_methods_answer_json(
    gateway, acme, settings, debug, method, path, status
):
    settings.DEBUG = debug
    with acme.http(gateway) as http:
        error = error_of(http.request(method, path), status)
    assert error["code"] in {"unknown_url", "method_not_allowed"}


@pytest.mark.parametrize("debug", [False, True])
def test_an_unexpected_exception_is_a_json_500(gateway, acme, settings, monkeypatch, debug):
    settings.DEBUG = debug  # Django's debug page must not answer either

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    from openai_api.batches import views as batch_views
    from openai_api.gateway import services

    monkeypatch.setattr(services, "models_list", broken)
    monkeypatch.setattr(batch_views.selectors, "batches_for_tenant", broken)
    with acme.http(gateway) as http:
        for path in ["/v1/models", "/v1/batches"]:
            error = error_of(http.get(path), 500)
            assert (error["type"], error["code"]) == ("server_error", "internal_error")
            assert "a bug" not in error["message"]  # nothing of the internals leaks


def test_a_host_not_allowed_is_a_json_400(gateway, acme, settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    with acme.http(gateway) as http:
        assert http.get("/v1/models").status_code == 200
        for path in ["/v1/models", "/v1/chat/completions", "/metrics"]:
            error = error_of(http.get(path, headers={"Host": "evil.example"}), 400)
            assert (error["code"], error["param"]) == ("invalid_host", "Host")


# --- /metrics ---------------------------------------------------------------------------------


def test_metrics_are_off_without_a_token(gateway, settings):
    settings.METRICS_TOKEN = None
    with httpx.Client(base_url=gateway.url) as http:
        error = error_of(http.get("/metrics"), 403)
    assert error["code"] == "metrics_disabled"


def test_metrics_need_the_token_when_it_is_set(gateway, settings):
    settings.METRICS_TOKEN = "s3cret-token"
    with httpx.Client(base_url=gateway.url) as http:
        for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"},
                        {"Authorization": "Bearer s3cret-token-and-more"}]:  # fmt: skip
            response = http.get("/metrics", headers=headers)
            assert error_of(response, 401)["code"] == "invalid_metrics_token"
            assert response.headers["WWW-Authenticate"] == "Bearer"
        ok = http.get("/metrics", headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200
        assert "gateway_requests_total" in ok.text
        assert error_of(http.post("/metrics"), 405)["code"] == "method_not_allowed"


def test_metrics_token_is_read_from_the_environment(tmp_path):
    from config import env

    services = {"DATABASE_URL": "postgres://app@db/market", "REDIS_URL": "redis://cache:6379/0"}
    assert env.load({**services, "METRICS_TOKEN": "  tok  "}).metrics_token == "tok"
    assert env.load({**services, "METRICS_TOKEN": " "}).metrics_token is None
    assert env.load(services).metrics_token is None


# --- status lines -----------------------------------------------------------------------------


def test_the_status_line_has_the_standard_reason_phrase(gateway, acme, settings):
    settings.METRICS_TOKEN = None
    with acme.http(gateway) as http:
        answers = {
            422: http.post("/v1/completions", json={"model": "m", "prompt": "x", "bid": "-1"}),
            400: http.post("/v1/completions", content=b"{"),
            401: http.get("/v1/models", headers={"Authorization": "Bearer nope"}),
            403: http.get("/metrics"),
            404: http.get("/v1/nope"),
            405: http.get("/v1/completions"),
        }
    for status, response in answers.items():
        assert response.status_code == status
        assert response.reason_phrase == HTTPStatus(status).phrase  # never "Unknown Status"
    assert answers[422].reason_phrase == "Unprocessable Entity"
