"""The OpenAPI document itself: valid OpenAPI 3.1, one operation per route under ``/v1`` of the
URLconf and no other, and its error codes exactly those the gateway's code raises, each with
the status its error class gives it (read from the source, not from the document)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

from django.urls import URLPattern, URLResolver, get_resolver
from openapi_spec_validator import validate

import openai_api
from openai_api.gateway.errors import GatewayError
from openai_api.openapi.document import ERROR_CODES, openapi_document

SOURCE = Path(openai_api.__file__).parent
# Codes the gateway has that no /v1 answer carries: /metrics's own two; class defaults that are
# only ever raised with a code of their own (NotFound as unknown_url) or not at all under /v1
# (the base class; Forbidden, from PermissionDenied, which no /v1 view raises); and the codes
# of a batch line's error, written in the result files, never an HTTP answer (BatchLineError's
# description lists them).
NOT_V1_ANSWERS = {
    "metrics_disabled",
    "invalid_metrics_token",
    "invalid_request",
    "not_found",
    "forbidden",
    "answer_lost",
    "batch_failed",
}


def _routes(patterns, prefix: str = "") -> list[str]:
    found = []
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            found += _routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            found.append(prefix + str(pattern.pattern))
    return found


def test_the_document_is_valid_openapi_3_1():
    document = openapi_document()
    assert document["openapi"] == "3.1.0"
    validate(document)  # openapi-spec-validator: raises on the first problem


def test_every_v1_route_is_documented_and_nothing_else():
    routes = {
        "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        for route in _routes(get_resolver().url_patterns)
        if route.startswith("v1/")
    }
    assert routes == set(openapi_document()["paths"])
    assert len(routes) == 13


def _error_classes() -> dict[str, type[GatewayError]]:
    for module in pkgutil.walk_packages([str(SOURCE)], prefix="openai_api."):
        if ".migrations" not in module.name:
            importlib.import_module(module.name)
    classes: dict[str, type[GatewayError]] = {}
    pending = [GatewayError]
    while pending:
        kind = pending.pop()
        classes[kind.__name__] = kind
        pending += kind.__subclasses__()
    return classes


def _raised_codes() -> set[tuple[str, int]]:
    """(code, status) of every error the package's source constructs: a GatewayError class
    called with or without ``code=``, and each class's own code (a subclass may be raised by
    a base's caller)."""
    classes = _error_classes()
    codes = {(kind.code, kind.status) for kind in classes.values()}
    for path in SOURCE.rglob("*.py"):
        if "openapi" in path.parts or "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name not in classes:
                continue
            for keyword in node.keywords:
                if keyword.arg == "code" and isinstance(keyword.value, ast.Constant):
                    codes.add((keyword.value.value, classes[name].status))
    return codes


def test_the_documented_error_codes_are_the_ones_the_code_raises_with_their_status():
    raised = {(code, status) for code, status in _raised_codes() if code not in NOT_V1_ANSWERS}
    documented = {(x.code, x.status) for x in ERROR_CODES}
    # invalid_batch_input's status is set per file (400 if a line is malformed, else 422).
    assert ("invalid_batch_input", 400) in raised
    raised.add(("invalid_batch_input", 422))
    assert documented == raised
    assert len(documented) == 23


def test_each_status_of_an_operation_lists_its_codes():
    """The 422 of a completion lists invalid_value and invalid_batch_input is only the batch
    submission's; the bearer scheme is the default and the document itself needs no key."""
    document = openapi_document()
    chat = document["paths"]["/v1/chat/completions"]["post"]["responses"]
    codes = chat["422"]["content"]["application/json"]["schema"]["allOf"][1]
    assert codes["properties"]["error"]["properties"]["code"]["enum"] == ["invalid_value"]
    assert "Retry-After" in chat["429"]["headers"] and "x-should-retry" in chat["429"]["headers"]
    submit = document["paths"]["/v1/batches"]["post"]["responses"]
    enum = submit["422"]["content"]["application/json"]["schema"]["allOf"][1]
    assert enum["properties"]["error"]["properties"]["code"]["enum"] == [
        "invalid_batch_input",
        "invalid_value",
    ]
    assert document["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    assert document["security"] == [{"apiKey": []}]
    assert document["paths"]["/v1/openapi.json"]["get"]["security"] == []
