"""Checking an answer of the running gateway against the OpenAPI document's schema for it."""

from __future__ import annotations

import json
from typing import Any

import httpx
from jsonschema import Draft202012Validator

from openai_api.openapi.document import openapi_document


def schema_of(path: str, method: str, status: int, media: str = "application/json") -> dict:
    """The document's schema for the ``status`` answer of ``method path`` (the path as the
    document writes it, ``{batch_id}`` included), with the components its $refs point at."""
    document = openapi_document()
    responses = document["paths"][path][method.lower()]["responses"]
    assert str(status) in responses, f"{method} {path} does not document a {status}"
    schema = responses[str(status)]["content"][media]["schema"]
    return {**schema, "components": document["components"]}


def component(name: str) -> dict:
    document = openapi_document()
    return {"$ref": f"#/components/schemas/{name}", "components": document["components"]}


def problems(instance: Any, schema: dict) -> list[str]:
    """What of ``instance`` the schema refuses, one line each (empty: valid)."""
    validator = Draft202012Validator(schema)
    return [f"{list(err.absolute_path)}: {err.message}" for err in validator.iter_errors(instance)]


def checked(response: httpx.Response, path: str, method: str | None = None) -> Any:
    """The JSON body of ``response``, after checking it against the document's schema for its
    status at ``path`` (AssertionError naming each problem)."""
    method = method or response.request.method
    body = response.json()
    found = problems(body, schema_of(path, method, response.status_code))
    assert not found, (response.status_code, body, found)
    return body


def sse_events(text: str) -> list[Any]:
    """The JSON payloads of a server-sent event stream, ``[DONE]`` dropped (and checked last)."""
    datas = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert datas[-1] == "[DONE]", datas[-1:]
    return [json.loads(data) for data in datas[:-1]]
