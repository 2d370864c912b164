"""The document's request schemas and the gateway's validation agree: the schemas are generated
from the models that validate, and this checks that what pydantic runs (its Python-side rules
included) is what the schema says to a client's own JSON Schema validator.

For every field of the chat and text completion bodies, values are drawn from the field's own
schema (each bound and one step past it, each enum member and a stranger, each length limit and
one past it) and from other JSON types; each value in a minimal body is put to the schema
(jsonschema) and to the gateway's validation (``gateway.validation``, what the running gateway
calls). They must give the same verdict, except where JSON Schema cannot say the rule, listed
in ``BEYOND_SCHEMA`` and told to readers in the field's description. Refused values are then
sent to the running gateway: each refusal carries a code the document lists under its status.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from openai_api.gateway.errors import GatewayError
from openai_api.gateway.refusals import body_parsed
from openai_api.gateway.validation import CHAT, COMPLETIONS, completion_params
from openai_api.openapi.document import openapi_document
from tests.openai_api.openapi.schema_check import component, problems, schema_of

BASES = {
    CHAT: (
        "ChatCompletionRequest",
        "/v1/chat/completions",
        {"model": "org/m", "messages": [{"role": "user", "content": "Hi"}]},
    ),
    COMPLETIONS: ("CompletionRequest", "/v1/completions", {"model": "org/m", "prompt": "Hi"}),
}
OTHER_TYPES = [None, True, False, 0, 7, -3, 0.5, "text", "", {}, [], ["text"], [7], [[7]]]
# (field, value): the gateway refuses, JSON Schema cannot say why: a bid string's range and
# places (a pattern cannot compare numbers), a bid number's places (multipleOf 1e-9 is not exact
# in binary floating point), an integer written with a fraction (JSON Schema's integer is any
# number with a zero fraction; the gateway keeps the digits sent). Nothing else.
BEYOND_SCHEMA: set[tuple[str, str]] = {
    ("bid", json.dumps("1000000.5")),
    ("bid", json.dumps("1e7")),
    ("bid", json.dumps("0.0000000001")),
    ("bid", json.dumps(1e-10)),
    ("n", json.dumps(1.0)),
    ("max_tokens", json.dumps(5.0)),
}


def _resolve(schema: dict) -> dict:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    return openapi_document()["components"]["schemas"][ref.rsplit("/", 1)[1]]


def probes(schema: dict) -> list[Any]:
    """Values at and one step past each limit ``schema`` states, and values of other types."""
    values: list[Any] = list(OTHER_TYPES)
    for branch in [_resolve(b) for b in schema.get("anyOf", [schema])]:
        kind = branch.get("type")
        step = 1 if kind == "integer" else 0.001
        for bound, outside in (("minimum", -step), ("maximum", step)):
            if bound in branch:
                values += [branch[bound], branch[bound] + outside]
        values += list(branch.get("enum", []))
        if "const" in branch:
            values += [branch["const"], branch["const"] + 1]
        if kind == "string":
            for bound, outside in (("minLength", -1), ("maxLength", 1)):
                if bound in branch:
                    values += ["x" * branch[bound], "x" * max(0, branch[bound] + outside)]
        if kind == "array" and "items" in branch:
            item = probes(_resolve(branch["items"]))[len(OTHER_TYPES) :] or ["text"]
            inside = [v for v in item if not problems(v, {**_resolve(branch["items"])})]
            sample = inside[0] if inside else "text"
            for bound, outside in (("minItems", -1), ("maxItems", 1)):
                if bound in branch:
                    values += [[sample] * branch[bound], [sample] * max(0, branch[bound] + outside)]
            values += [[x] for x in item]
        if kind == "object":
            values += [{}, {name: "text" for name in branch.get("properties", {})}]
            values += [{name: True for name in branch.get("properties", {})}]
    return values


# Values a pattern or a shape decides, beside those the bounds give.
EXTRA = {
    "bid": [
        "0.01",
        "2",
        "1e-2",
        " 0.5 ",
        "-0",
        "-0.0",
        "-1",
        "1_0",
        "0x10",
        "NaN",
        "abc",
        "",
        "1000000.5",
        "1e7",
        "0.0000000001",
        1e-10,
        0.000000001,
        1000000,
        1000000.001,
        -0.5,
    ],
    "request_class": ["background", " batch.v2 ", "a" * 50, "a" * 51, "has space", "émoji"],
    "model": ["   ", "x" * 256, "x" * 257],
    "service_tier": ["flex", "priority", "auto", "default", "scale", "FLEX"],
    "messages": [
        [{"role": "user"}],
        [{"role": "robot", "content": "x"}],
        [{"content": "x"}],
        [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
        [{"role": "user", "content": [{"type": "text"}]}],
        ["hi"],
    ],
    "prompt": [
        "x",
        [1, 2, 3],
        ["x"],
        [[1, 2]],
        [[]],
        [""],
        ["a", "b"],
        [[1], [2]],
        [-1],
        [2**31 - 1],
        [2**31],
        [1, "a"],
    ],
    "stop": [["a", "b", "c", "d"], ["a", "b", "c", "d", "e"], [1]],
    "stream_options": [{"include_usage": True}, {"include_usage": "yes"}],
    "n": [1.0],
    "max_tokens": [5.0],
}


def _cases() -> list[tuple[str, str, str]]:
    cases = []
    for endpoint, (name, _, _) in BASES.items():
        request = openapi_document()["components"]["schemas"][name]
        for field, schema in request["properties"].items():
            values = probes(schema) + EXTRA.get(field, [])
            if field in ("model", "messages", "prompt"):
                values.append(_ABSENT)
            seen = set()
            for value in values:
                text = json.dumps(value)
                if (field, text) not in seen:
                    seen.add((field, text))
                    cases.append((endpoint, field, text))
    return cases


_ABSENT = {"absent": "the field left out"}


def _body(endpoint: str, field: str, text: str) -> dict:
    body = dict(BASES[endpoint][2])
    value = json.loads(text)
    if value == _ABSENT:
        del body[field]
    else:
        body[field] = value
    return body


def _gateway_verdict(body: dict, endpoint: str) -> GatewayError | None:
    try:
        completion_params(body_parsed(json.dumps(body).encode()), endpoint=endpoint, headers={})
    except GatewayError as exc:
        return exc
    return None


CASES = _cases()


def test_the_probes_cover_every_field_and_both_verdicts():
    fields = {(endpoint, field) for endpoint, field, _ in CASES}
    for endpoint, (name, _, _) in BASES.items():
        properties = openapi_document()["components"]["schemas"][name]["properties"]
        assert {(endpoint, f) for f in properties} <= fields
    verdicts = [_gateway_verdict(_body(e, f, t), e) is None for e, f, t in CASES]
    assert sum(verdicts) > 100 and len(verdicts) - sum(verdicts) > 300


@pytest.mark.parametrize(("endpoint", "field", "text"), CASES)
def test_schema_and_validation_give_the_same_verdict(endpoint, field, text):
    body = _body(endpoint, field, text)
    by_schema = problems(body, component(BASES[endpoint][0]))
    refusal = _gateway_verdict(body, endpoint)
    if (field, text) in BEYOND_SCHEMA:
        assert refusal is not None and not by_schema
        return
    assert (refusal is None) == (not by_schema), (refusal and refusal.message, by_schema)


def test_what_only_the_gateway_checks_is_said_in_the_description():
    document = openapi_document()
    bid = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]["bid"]
    text = json.dumps(bid)
    assert "checked by the gateway" in text and "at most 9 decimal places" in text
    assert "integers are written without a fraction" in document["info"]["description"]


def test_each_refusal_of_the_running_gateway_is_documented(gateway, acme):
    """A refused probe of each field and status, sent: the running gateway answers it as the
    validation did, with a body and code the operation lists under that status."""
    refused = {}
    for endpoint, field, text in CASES:
        refusal = _gateway_verdict(_body(endpoint, field, text), endpoint)
        if refusal is not None:
            refused.setdefault((endpoint, field, refusal.status), (text, refusal))
    seen = set()
    with acme.http(gateway) as http:
        for (endpoint, field, status), (text, refusal) in refused.items():
            path = BASES[endpoint][1]
            answer = http.post(path, content=json.dumps(_body(endpoint, field, text)))
            assert answer.status_code == status, answer.text
            assert answer.json()["error"]["message"] == refusal.message
            found = problems(answer.json(), schema_of(path, "post", status))
            assert not found, (field, text, answer.text, found)
            seen.add((status, answer.json()["error"]["code"]))
    assert len(refused) > 40
    assert seen == {(400, "malformed_request"), (422, "invalid_value")}


def test_a_refusal_outside_the_schema_is_still_documented(gateway, acme):
    with acme.http(gateway) as http:
        answer = http.post("/v1/completions", json={"model": "org/m", "prompt": "x", "bid": "1e7"})
    assert answer.status_code == 422
    assert not problems(answer.json(), schema_of("/v1/completions", "post", 422))


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_the_documented_examples_are_valid_and_accepted(endpoint):
    name = BASES[endpoint][0]
    examples = openapi_document()["components"]["schemas"][name]["examples"]
    assert examples
    for example in examples:
        assert not problems(example, component(name))
        assert _gateway_verdict(example, endpoint) is None


def test_every_field_the_gateway_refuses_as_unsupported_is_documented_so():
    from openai_api.gateway.validation import _UNSUPPORTED

    schemas = openapi_document()["components"]["schemas"]
    for name, _, _ in BASES.values():
        properties = schemas[name]["properties"]
        for field in _UNSUPPORTED:
            assert "not supported" in properties[field]["description"], (name, field)


def test_a_request_class_may_have_a_latency_target_and_the_cap_bounds_it():
    """The body's ``request_class`` says a class's autobid setting may be a latency target,
    and the tenant's cap (its help text too) bounds the bids of both the tier and the target."""
    from accounts.models import Tenant

    for schema in ("ChatCompletionRequest", "CompletionRequest"):
        properties = openapi_document()["components"]["schemas"][schema]["properties"]
        text = json.dumps(properties["request_class"])
        assert '{\\"ttft_s\\": T, \\"p\\": p}' in text and "priority_bid_cap" in text, schema
    help_text = str(Tenant._meta.get_field("priority_bid_cap").help_text)
    assert "'priority'" in help_text and "latency target" in help_text
