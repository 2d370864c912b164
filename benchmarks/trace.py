"""Replay a recorded trace: ``--trace FILE.jsonl``, one request a line.

    {"id": "r1", "arrival": 0.25, "tenant": "acme", "prompt_tokens": [1, 2, 3],
     "max_new_tokens": 64, "bid": 0.5}

- ``arrival``: seconds from the start of the trace (multiplied by ``--time-scale``);
- ``prompt_tokens``: a list of token ids, or an int (that many random ids, seeded); or instead
  ``prompt``: text, cut into token ids by the simulated engine's tokenizer (the ids the server
  would give the same text);
- ``bid``: dollars per second of waiting, >= 0; ``tenant`` (optional) a string; ``class``
  (optional) the bid class the report groups latency by; without it, bids above the trace's
  80th percentile are ``high``, the rest ``low``.

Blank lines are skipped; any other bad line raises TraceError naming the line and the field.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

from engines.contract.tokenizer import Tokenizer
from mechanism import MAX_BID

from .bids import classes_by_quantile
from .workloads import BenchRequest, Workload, random_tokens


class TraceError(ValueError):
    """A line of a trace file is malformed."""


def tokenize(text: str) -> tuple[int, ...]:
    """Token ids of ``text``, as the simulated engine's server would cut it."""
    return tuple(Tokenizer().encode(text))


def _number(obj: dict, field: str, where: str) -> float:
    value = obj.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceError(f"{where}: field {field!r} must be a finite number, got {value!r}")
    return float(value)


def _prompt(obj: dict, where: str, rng: random.Random) -> tuple[int, ...]:
    has_tokens, has_text = "prompt_tokens" in obj, "prompt" in obj
    if has_tokens == has_text:
        raise TraceError(f"{where}: give exactly one of fields 'prompt_tokens' and 'prompt'")
    if has_text:
        text = obj["prompt"]
        if not isinstance(text, str):
            raise TraceError(f"{where}: field 'prompt' must be a string, got {text!r}")
        tokens = tokenize(text)
        if not tokens:
            raise TraceError(f"{where}: field 'prompt' has no tokens")
        return tokens
    value = obj["prompt_tokens"]
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise TraceError(f"{where}: field 'prompt_tokens' must be >= 1, got {value}")
        return random_tokens(rng, value)
    if not isinstance(value, list) or not value:
        raise TraceError(
            f"{where}: field 'prompt_tokens' must be a non-empty list of token ids or a length"
        )
    for tok in value:
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise TraceError(
                f"{where}: field 'prompt_tokens' must hold token ids (ints >= 0), got {tok!r}"
            )
    return tuple(value)


def parse_trace(lines: list[str], *, time_scale: float = 1.0, seed: int = 0) -> Workload:
    """The trace's requests, ``arrival`` multiplied by ``time_scale``; TraceError if malformed."""
    if not time_scale > 0 or not math.isfinite(time_scale):
        raise ValueError(f"time scale must be finite and > 0, got {time_scale}")
    rng = random.Random(f"{seed}:trace")
    rows: list[tuple[BenchRequest, str | None]] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"trace line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected a JSON object")
        rid = obj.get("id")
        if isinstance(rid, int) and not isinstance(rid, bool):
            rid = str(rid)
        if not isinstance(rid, str) or not rid:
            raise TraceError(f"{where}: field 'id' must be a non-empty string, got {rid!r}")
        if rid in seen:
            raise TraceError(f"{where}: field 'id' repeats {rid!r}")
        seen.add(rid)
        arrival = _number(obj, "arrival", where)
        if arrival < 0:
            raise TraceError(f"{where}: field 'arrival' must be >= 0, got {arrival}")
        bid = _number(obj, "bid", where)
        if not 0 <= bid <= MAX_BID:
            raise TraceError(f"{where}: field 'bid' must be in [0, {MAX_BID:g}], got {bid}")
        out = obj.get("max_new_tokens")
        if isinstance(out, bool) or not isinstance(out, int) or out < 1:
            raise TraceError(f"{where}: field 'max_new_tokens' must be an int >= 1, got {out!r}")
        tenant = obj.get("tenant", "-")
        if not isinstance(tenant, str):
            raise TraceError(f"{where}: field 'tenant' must be a string, got {tenant!r}")
        cls = obj.get("class")
        if cls is not None and not isinstance(cls, str):
            raise TraceError(f"{where}: field 'class' must be a string, got {cls!r}")
        tokens = _prompt(obj, where, rng)
        req = BenchRequest(rid, tokens, out, bid, "", arrival * time_scale, tenant)
        rows.append((req, cls))
    if not rows:
        raise TraceError("the trace holds no requests")
    default = classes_by_quantile([r.bid for r, _ in rows])
    requests = tuple(
        replace(r, bid_class=cls or d) for (r, cls), d in zip(rows, default, strict=True)
    )
    requests = tuple(sorted(requests, key=lambda r: r.arrival))
    title = f"trace: {len(requests)} requests, time scale {time_scale:g}"
    return Workload("trace", f"trace:{seed}:{time_scale}:{len(requests)}", requests, title=title)


def load_trace(path: str | Path, *, time_scale: float = 1.0, seed: int = 0) -> Workload:
    """``parse_trace`` of a file; TraceError names the file too."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        return parse_trace(text.splitlines(), time_scale=time_scale, seed=seed)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None
