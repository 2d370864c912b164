"""Batch files and hand counts for the batch tests.

Prompts are token ids, so their token counts are their lengths; each starts with its own id,
so no two share a prefix and the engine's cache serves none of them (cached tokens 0).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal

import pytest

from openai_api.models import BatchJob
from tests.openai_api.helpers import token_charge_by_hand
from tests.scheduler_bridge.workers import queue_forget


def completion_line(custom_id: str, model: str, *, prompt: list[int], max_tokens: int, **extra):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens} | extra
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


def jsonl(lines: list[dict]) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


def prompt_of(i: int, tokens: int) -> list[int]:
    """``tokens`` token ids starting with one of its own (no shared prefix across ``i``)."""
    return [1000 + i] + [5000 + 7 * i + k for k in range(tokens - 1)]


def charge_of(line: dict) -> Decimal:
    """What serving a token-id completion line costs: its prompt's length of input tokens and
    max_tokens of output tokens (the simulated engine always generates max_tokens)."""
    body = line["body"]
    return token_charge_by_hand(prompt=len(body["prompt"]), cached=0, completion=body["max_tokens"])


def results(text: str) -> dict[str, dict]:
    """A result file's lines by custom_id (each custom_id at most once)."""
    rows = [json.loads(row) for row in text.splitlines()]
    by_id = {row["custom_id"]: row for row in rows}
    assert len(by_id) == len(rows), "a custom_id appears twice"
    return by_id


def batch_of(public_id: str) -> BatchJob:
    return BatchJob.objects.get(public_id=public_id)


@pytest.fixture
def batch_queue(settings) -> Iterator[str]:
    """Submitted batches are queued on a queue of this test's that no worker reads (the tests
    run them themselves); it is deleted after."""
    queue = f"imtest-batches-{uuid.uuid4().hex[:12]}"
    settings.BATCH_QUEUE = queue
    yield queue
    queue_forget(queue)
