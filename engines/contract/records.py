"""Round records: what an engine reports about each auction round (docs/mechanism.md, "Rounds and
charging").

One schema for both engines: the simulated engine and the SGLang plugin emit these, the
round-record consumers publish them to the consoles (they move no money). Pure Python (no
Django), because the plugin runs inside SGLang's scheduler process. On the wire a record is
JSON, in the field ``record`` of a Redis stream entry.

Units: bids and reserve in dollars per second of waiting, charges in dollars, times in seconds
(``time`` is the engine's clock: Unix time in real time, seconds from the start in virtual time).
"""

from __future__ import annotations

import json
import math
from typing import Any, NotRequired, TypedDict, cast

from engines.contract.wire import AUCTION_META_FIELDS
from mechanism.whatif import QueueSnapshot, queue_snapshot_checked

# @2: ``epoch`` and every admitted request's ``block`` are required (both engines write them).
SCHEMA = "inference-market/round@2"
# The Redis stream both engines write their records to and settlement reads, unless configured
# otherwise (the engines' --rounds-stream / ``rounds_stream``, Django's ``ROUNDS_STREAM``).
DEFAULT_STREAM = "inference-market:rounds"


class SubtreeSummary(TypedDict):
    """One subtree of the waiting queue's request tree, aggregated (no request, no single bid).

    ``owners`` counts its requests by tenant tag, for the operators' book: a record goes to the
    market's settlement and console, never to a tenant.
    """

    key: str  # stable id of the subtree's prefix (a hash of its tokens)
    label: str  # a readable prefix label (decoded text, or the leading token ids)
    # Where it departs from its parent: the parent's key ("" below the root) and a readable
    # label of the first tokens of its own edge, which tells siblings apart.
    parent: NotRequired[str]
    branch: NotRequired[str]
    depth: int  # 1 for a child of the root, 2 below it, ...
    prefix_tokens: int  # tokens from the root to the end of the subtree's edge
    cached_tokens: int  # of those, already in the KV cache
    requests: int
    bid_sum: float  # effective bids, dollars per second
    bid_mean: float
    # The age credits its requests have earned by waiting ($/s, ranked as bid, never paid;
    # absent: none, or an engine from before credits were recorded).
    credit_sum: NotRequired[float]
    # (bid_sum + credit_sum) per uncached token of the subtree's work, $/s per token
    density: float
    rank: int  # position among its siblings in this round's order, 0 first
    first_position: int  # position of its first request in the round's whole order
    owners: NotRequired[dict[str, int]]  # requests by tenant tag ("": a request without one)


class BlockInfo(TypedDict):
    """The top-level subtree the request waited in, at this round ("why this rank")."""

    prefix_tokens: int
    requests: int
    bid_mean: float  # $/s
    density: float  # $/s per uncached token


class AdmittedRequest(TypedDict):
    """A request the engine admitted in this round: it is served and pays this round's charge."""

    request_id: str
    bid: float  # as sent, $/s
    effective_bid: float  # 0 when under the reserve
    position: int  # its place in the round's order, 0 first
    # From the round's plan (docs/mechanism.md, "Requests, the request tree and work").
    planned_completion_s: float
    time_saved_s: float  # planned seconds its bid saved it over bidding 0
    charge: float  # priority charge, dollars (docs/mechanism.md, "Payments")
    prompt_tokens: int
    cached_tokens: int
    block: BlockInfo
    # Its place in line when it joined the queue: in the first round that ordered it (the
    # round that admitted it, for a request admitted at once). ``rank`` counts from 1 (1: first
    # in line), ``ahead`` the waiting requests that round planned before it (rank - 1), and
    # ``queue_len`` the requests waiting in that round, itself included. Optional: records of
    # engines from before these fields are still read.
    rank: NotRequired[int]
    ahead: NotRequired[int]
    queue_len: NotRequired[int]
    # Its age credit in the round, $/s, when it had one (the wait bound, mechanism.aging): what
    # ranked it beyond its bid, never money. Absent: none.
    age_credit: NotRequired[float]


class RoundRecord(TypedDict):
    """One auction round of one engine."""

    schema: str
    engine: str  # which engine instance ("sim", "sglang@host:port", ...)
    market: str  # the market (served model) slug
    epoch: str  # one run of the engine: a restart has a new epoch and starts again at seq 1
    round_id: str  # unique across engines and restarts ("<engine>:<epoch>:<seq>"; never parsed)
    seq: int  # increasing within one engine run (one epoch)
    time: float
    policy: str
    reserve: float
    tokens_per_second: float
    waiting: int  # requests in the queue when the round cleared
    subtrees: list[SubtreeSummary]
    admitted: list[AdmittedRequest]
    # With the book: the waiting requests' bids as sent, $/s, ascending; at most
    # ``writer.BOOK_BIDS`` of them, evenly spaced through the sorted bids when more wait (what
    # the console counts against a new reserve before it is applied).
    waiting_bids: NotRequired[list[float]]
    # With the book, when at most ``whatif.QUEUE_LIMIT`` requests wait: the waiting queue as the
    # round cleared it, for the console's reserve what-if (``mechanism.whatif``).
    queue: NotRequired[QueueSnapshot]


# An admitted request's place in line (AdmittedRequest): optional, ints when there.
PLACE_FIELDS = ("rank", "ahead", "queue_len")


def auction_fields(record: RoundRecord, entry: AdmittedRequest) -> dict[str, Any]:
    """The auction's ``meta_info`` fields (``wire.AUCTION_META_FIELDS``, those the entry has:
    its place in line is optional) of a request that ``record`` admitted (``entry``): what both
    engines tell the request's client, and all that its settlement needs (the priority charge
    reaches the ledger this way only)."""
    fields: dict[str, Any] = {**entry, "round_id": record["round_id"], "engine": record["engine"]}
    return {name: fields[name] for name in AUCTION_META_FIELDS if name in fields}


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema": str,
    "engine": str,
    "market": str,
    "epoch": str,
    "round_id": str,
    "seq": int,
    "time": (int, float),
    "policy": str,
    "reserve": (int, float),
    "tokens_per_second": (int, float),
    "waiting": int,
    "subtrees": list,
    "admitted": list,
}
_ADMITTED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "request_id": str,
    "bid": (int, float),
    "effective_bid": (int, float),
    "position": int,
    "planned_completion_s": (int, float),
    "time_saved_s": (int, float),
    "charge": (int, float),
    "prompt_tokens": int,
    "cached_tokens": int,
    "block": dict,
}
_BLOCK_FIELDS: dict[str, type | tuple[type, ...]] = {
    "prefix_tokens": int,
    "requests": int,
    "bid_mean": (int, float),
    "density": (int, float),
}


def _check_fields(obj: Any, fields: dict[str, Any], where: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
    for name, kind in fields.items():
        if name not in obj:
            raise ValueError(f"{where}: missing field {name!r}")
        value = obj[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(f"{where}: field {name!r} has the wrong type ({value!r})")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{where}: field {name!r} is not finite ({value!r})")


def _amount(value: Any) -> bool:
    """Whether ``value`` is an amount: a finite number >= 0 (a bool is not one)."""
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def round_record_checked(obj: Any) -> RoundRecord:
    """Return ``obj`` as a RoundRecord, or raise ValueError saying what is wrong with it."""
    _check_fields(obj, _FIELDS, "round record")
    if obj["schema"] != SCHEMA:
        raise ValueError(f"round record: unknown schema {obj['schema']!r}, expected {SCHEMA!r}")
    where = f"round {obj['round_id']!r}"
    seen = set()
    for i, adm in enumerate(obj["admitted"]):
        _check_fields(adm, _ADMITTED_FIELDS, f"{where}, admitted[{i}]")
        _check_fields(adm["block"], _BLOCK_FIELDS, f"{where}, admitted[{i}].block")
        place = {name: int for name in PLACE_FIELDS if name in adm}
        _check_fields(adm, place, f"{where}, admitted[{i}]")
        if "age_credit" in adm and not _amount(adm["age_credit"]):
            raise ValueError(f"{where}, admitted[{i}]: age_credit must be an amount in $/s")
        if adm["request_id"] in seen:
            raise ValueError(f"{where}: request {adm['request_id']!r} admitted twice")
        seen.add(adm["request_id"])
        if adm["charge"] < 0 or adm["bid"] < 0:
            raise ValueError(f"{where}: request {adm['request_id']!r} has a negative amount")
    bids = obj.get("waiting_bids")
    if bids is not None and not (isinstance(bids, list) and all(map(_amount, bids))):
        raise ValueError(f"{where}: waiting_bids must be a list of amounts in $/s")
    if "queue" in obj:
        queue = queue_snapshot_checked(obj["queue"], f"{where}, queue")
        if len(queue["id"]) != obj["waiting"]:
            raise ValueError(f"{where}, queue: holds {len(queue['id'])} requests, not 'waiting'")
    return cast(RoundRecord, obj)


def round_record_dumps(record: RoundRecord) -> str:
    """The record as compact JSON, for a Redis stream entry's ``record`` field."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False)


def round_record_loads(text: str | bytes) -> RoundRecord:
    """Parse and check a record from its JSON; ValueError if it is malformed."""
    try:
        obj = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"round record is not JSON: {exc}") from exc
    return round_record_checked(obj)
