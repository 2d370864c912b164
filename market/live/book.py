"""The live order book: rows from round records, keyed diffs, and the last published state.

A round record's ``subtrees`` (``engines.contract.records.SubtreeSummary``) is the waiting
queue aggregated by prefix subtree, at most every ``book_interval_s`` of the engine; a record
without them says nothing about the book (the previous one stands), unless its round admitted every
waiting request: then the queue is empty.

A market of several replicas has one book: each replica's latest rows are kept apart (a replica
silent for ``ENGINE_BOOK_TTL_S`` is dropped: it died or left), and the published rows are their
merge by subtree key (the same prefix has the same key in every engine's records): requests,
bids and credits summed, density over the summed work, the best rank and position, and per row
the requests each replica holds (``replicas``, on a merge of more than one).

The book is the operators' (``market.<slug>`` is a staff group): each row says whose requests
wait in it (``tenants``: requests by tenant slug, from the tenant tags the engine's records
count), and each engine's part keeps the waiting bids its last book record carried, which the
console counts against a reserve before it is applied (``book_bids``).

Each market's last published book lives in Django's cache (Redis, so every publishing process
and every consumer sees the same one), with a version. Publishing compares the new rows
with it and sends only the difference, under a short lock so two publishers (two Celery workers)
cannot interleave versions; at most once per ``min_interval_s`` per market.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypedDict

from django.core.cache import cache

from accounts.models import Tenant
from engines.contract.records import RoundRecord
from market.controls import ReserveImpact, reserve_impact
from market.live.send import group_send
from market.payloads import BookDiff, BookRow, BookSnapshot, market_group

logger = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.5  # at most two book messages per second per market
STATE_TTL_S = 24 * 3600  # a market silent this long starts again from version 0
LOCK_TTL_S = 5  # a lock left by a dead publisher expires after this, seconds
LOCK_WAIT_S = 1.0  # how long a publisher waits for the lock before giving up this time
ENGINE_BOOK_TTL_S = 30.0  # a replica's rows older than this leave the merged book


class EngineBook(TypedDict):
    """One engine's part of a market's book: its latest round's rows."""

    epoch: str
    seq: int
    at: float  # Unix seconds (wall) it was received
    waiting: int
    rows: dict[str, BookRow]
    bids: list[float] | None  # its record's waiting bids, $/s ascending (None: it sent none)


class BookState(TypedDict):
    """A market's last published book, as kept in the cache."""

    version: int
    published_at: float  # Unix seconds (wall) of the last message
    engine: str  # which engine reported the latest round
    epoch: str  # that engine run's epoch (round ids are "<engine>:<epoch>:<seq>")
    seq: int  # the round's number in that run
    meta: dict[str, Any]  # BookMeta without version
    rows: dict[str, BookRow]  # the merge of ``engines``' rows
    engines: dict[str, EngineBook]


def state_key(market: str) -> str:
    return f"live:book:{market}"


def book_rows(record: RoundRecord) -> dict[str, BookRow] | None:
    """The record's book keyed by subtree, or None when the record carries no book.

    A record that admitted every waiting request leaves an empty queue: an empty book. Only
    aggregate fields are copied (the anonymity of the public book does not depend on what an
    engine adds to its records).
    """
    subtrees = record.get("subtrees") or []
    if not subtrees:
        if record["waiting"] <= len(record["admitted"]):
            return {}
        return None
    rows: dict[str, BookRow] = {}
    names = tenant_names({tag for s in subtrees for tag in s.get("owners") or {}})
    for s in subtrees:
        row: BookRow = {
            "key": str(s["key"]),
            "label": str(s["label"]),
            "parent": str(s.get("parent", "")),
            "branch": str(s.get("branch", s["label"])),
            "depth": int(s["depth"]),
            "prefix_tokens": int(s["prefix_tokens"]),
            "cached_tokens": int(s["cached_tokens"]),
            "requests": int(s["requests"]),
            "bid_sum": float(s["bid_sum"]),
            "bid_mean": float(s["bid_mean"]),
            "credit_sum": float(s.get("credit_sum", 0.0)),
            "density": float(s["density"]),
            "rank": int(s["rank"]),
            "position": int(s["first_position"]),
            "tenants": {names[tag]: int(n) for tag, n in (s.get("owners") or {}).items()},
        }
        rows[row["key"]] = row
    return rows


# Tenant tags (the gateway sends a tenant's primary key) -> slugs, as far as this process has
# seen them: slugs never change, and a book record would otherwise cost a query.
_TENANT_SLUGS: dict[str, str] = {}


def tenant_names(tags: set[str]) -> dict[str, str]:
    """What the book calls the tenant of each tag: its slug; "" for requests without a tag, and
    the tag itself, marked, for one that is no tenant's."""
    unknown = [t for t in tags if t and t not in _TENANT_SLUGS and t.isdigit()]
    if unknown:
        for pk, slug in Tenant.objects.filter(pk__in=unknown).values_list("pk", "slug"):
            _TENANT_SLUGS[str(pk)] = slug
    return {t: "" if not t else _TENANT_SLUGS.get(t, f"tag {t}") for t in tags}


def round_place(record: RoundRecord) -> tuple[str, str, int]:
    """(engine, epoch, seq) of a record: rounds of one engine run are ordered by ``seq``."""
    return record["engine"], record["epoch"], int(record["seq"])


def book_meta(record: RoundRecord) -> dict[str, Any]:
    """The BookMeta fields a record gives (all but ``version``)."""
    return {
        "market": record["market"],
        "round_id": record["round_id"],
        "at": float(record["time"]),
        "waiting": int(record["waiting"]),
        "policy": record["policy"],
        "reserve": float(record["reserve"]),
    }


def book_merge(books: Mapping[str, Mapping[str, BookRow]]) -> dict[str, BookRow]:
    """One book from several engines' (engine id -> rows): see the module's docstring. One
    engine's book is returned as it is."""
    if len(books) <= 1:
        return dict(next(iter(books.values()), {}))
    merged: dict[str, BookRow] = {}
    work: dict[str, float] = {}  # key -> summed uncached tokens of work (ranked / density)
    for engine, rows in sorted(books.items()):
        for key, row in rows.items():
            ranked = row["bid_sum"] + row["credit_sum"]  # what the density is of
            own_work = ranked / row["density"] if row["density"] > 0 else 0.0
            if key not in merged:
                merged[key] = {**row, "replicas": {engine: row["requests"]}}
                work[key] = own_work
                continue
            m = merged[key]
            tenants = m["tenants"] = dict(m.get("tenants") or {})
            for name, n in (row.get("tenants") or {}).items():
                tenants[name] = tenants.get(name, 0) + n
            m["requests"] += row["requests"]
            m["bid_sum"] += row["bid_sum"]
            m["credit_sum"] += row["credit_sum"]
            m["cached_tokens"] = max(m["cached_tokens"], row["cached_tokens"])
            m["rank"] = min(m["rank"], row["rank"])
            m["position"] = min(m["position"], row["position"])
            m["replicas"][engine] = row["requests"]
            work[key] += own_work
    for key, m in merged.items():
        m["bid_mean"] = m["bid_sum"] / m["requests"] if m["requests"] else 0.0
        ranked = m["bid_sum"] + m["credit_sum"]
        m["density"] = ranked / work[key] if work[key] > 0 else m["density"]
    return merged


def book_diff(
    old: Mapping[str, BookRow], new: Mapping[str, BookRow]
) -> tuple[list[BookRow], list[str]]:
    """Rows of ``new`` that are not in ``old`` or differ from it, and keys ``new`` lost."""
    changed = [row for key, row in new.items() if old.get(key) != row]
    removed = [key for key in old if key not in new]
    return changed, removed


def book_apply(
    rows: Mapping[str, BookRow], changed: list[BookRow], removed: list[str]
) -> dict[str, BookRow]:
    """``rows`` after a diff (what a browser does with it)."""
    result = {k: v for k, v in rows.items() if k not in set(removed)}
    result.update({row["key"]: row for row in changed})
    return result


@contextmanager
def cache_lock(name: str, *, wait_s: float = LOCK_WAIT_S) -> Iterator[bool]:
    """A best-effort mutex across processes (``cache.add`` is atomic on Redis and locmem).

    Yields whether it was acquired within ``wait_s``.
    """
    token = uuid.uuid4().hex
    key = f"{name}:lock"
    deadline = time.monotonic() + wait_s
    acquired = cache.add(key, token, timeout=LOCK_TTL_S)
    while not acquired and time.monotonic() < deadline:
        time.sleep(0.005)
        acquired = cache.add(key, token, timeout=LOCK_TTL_S)
    try:
        yield acquired
    finally:
        if acquired and cache.get(key) == token:
            cache.delete(key)


def book_state(market: str) -> BookState | None:
    """The market's last published book, or None."""
    return cache.get(state_key(market))


def book_snapshot(market: str) -> BookSnapshot | None:
    """The last published book of ``market`` as a snapshot payload (None: nothing yet)."""
    state = book_state(market)
    if state is None:
        return None
    rows = sorted(state["rows"].values(), key=lambda r: (r["position"], r["depth"]))
    return {"kind": "book.snapshot", **state["meta"], "version": state["version"], "rows": rows}


def book_bids(market: str) -> list[tuple[list[float], int]] | None:
    """The waiting bids of ``market``'s current book: per engine, its last book record's bids
    ($/s ascending; a sample when it holds fewer than its queue) and how many requests wait
    there (none where its book is empty: its queue drained). None when there is no book, or an
    engine of it sent no bids."""
    state = book_state(market)
    if state is None:
        return None
    books = list((state.get("engines") or {}).values())
    if any(b.get("bids") is None for b in books):
        return None
    return [(list(b["bids"] or []), b["waiting"] if b["rows"] else 0) for b in books]


def book_queue_len(market: str) -> float | None:
    """The requests waiting per engine in ``market``'s current book (the mean of its engines'
    latest rounds' ``waiting``; 0 once the queue drained): the queue a new request joins, as
    a round record's ``queue_len`` counts it. None when there is no book yet."""
    state = book_state(market)
    if state is None:
        return None
    books = list((state.get("engines") or {}).values())
    if not books:  # cleared: the engines reported an empty queue
        return 0.0
    return sum(b["waiting"] for b in books) / len(books)


def book_reserve_impact(market: str, *, reserve: float, current: float) -> ReserveImpact | None:
    """What ``reserve`` ($/s) would do to ``market``'s book waiting now, against ``current``
    (``market.controls.reserve_impact``); None when no book with bids has come yet."""
    books = book_bids(market)
    if books is None:
        return None
    return reserve_impact(books, reserve=reserve, current=current)


def book_publish(
    *,
    record: RoundRecord,
    rows: dict[str, BookRow],
    min_interval_s: float = MIN_INTERVAL_S,
    now: float | None = None,
) -> str:
    """Publish ``rows`` (the book of ``record``) to the market's group as a diff.

    Returns ``"sent"``, ``"unchanged"`` (nothing differs: nothing sent), ``"throttled"`` (the
    market's last message is younger than ``min_interval_s``: the caller offers it again later),
    ``"stale"`` (an older round of the same engine than the published one) or ``"busy"``.
    """
    market = record["market"]
    engine, epoch, seq = round_place(record)
    with cache_lock(state_key(market)) as acquired:
        if not acquired:
            return "busy"
        now = time.time() if now is None else now
        state = book_state(market)
        engines: dict[str, EngineBook] = dict(state.get("engines") or {}) if state else {}
        if state is not None:
            if now - state["published_at"] < min_interval_s:
                return "throttled"
            mine = engines.get(engine)
            if mine is not None and mine["epoch"] == epoch and seq < mine["seq"]:
                return "stale"
        engines[engine] = {
            "epoch": epoch, "seq": seq, "at": now, "waiting": int(record["waiting"]), "rows": rows,
            # A drained queue (an empty book) has no bids; a book without them says nothing.
            "bids": record.get("waiting_bids", None if rows else []),
        }  # fmt: skip
        engines = {e: b for e, b in engines.items() if now - b["at"] <= ENGINE_BOOK_TTL_S}
        merged = book_merge({e: b["rows"] for e, b in engines.items()})
        old_rows = state["rows"] if state is not None else {}
        changed, removed = book_diff(old_rows, merged)
        meta = {
            **book_meta(record),
            "waiting": sum(b["waiting"] for b in engines.values()),
            # Each engine's latest round: replicas report in turn, so the record's own round
            # alone would jump between theirs (152, then another replica's 117).
            "rounds": {e: b["seq"] for e, b in sorted(engines.items())},
        }
        new_state: BookState = {
            "version": (state["version"] if state is not None else 0) + 1,
            "published_at": now,
            "engine": engine,
            "epoch": epoch,
            "seq": seq,
            "meta": meta,
            "rows": merged,
            "engines": engines,
        }
        if state is not None and not changed and not removed:
            # Nothing the browsers see changed: the published state stays, with this
            # engine's part brought up to date.
            cache.set(state_key(market), {**state, "engines": engines}, timeout=STATE_TTL_S)
            return "unchanged"
        _state_publish(market, new_state, changed=changed, removed=removed)
    return "sent"


def book_clear(*, market: str, now: float | None = None) -> bool:
    """Publish an empty book for ``market`` (its engine reports an empty queue) if the last
    published one had rows and is at least ``MIN_INTERVAL_S`` old. True when one was sent."""
    with cache_lock(state_key(market)) as acquired:
        if not acquired:
            return False
        now = time.time() if now is None else now
        state = book_state(market)
        if state is None or not state["rows"] or now - state["published_at"] < MIN_INTERVAL_S:
            return False
        meta = {**state["meta"], "waiting": 0}
        cleared: BookState = {
            **state,
            "version": state["version"] + 1,
            "published_at": now,
            "meta": meta,
            "rows": {},
            "engines": {},
        }
        _state_publish(market, cleared, changed=[], removed=list(state["rows"]))
    return True


def _state_publish(
    market: str, state: BookState, *, changed: list[BookRow], removed: list[str]
) -> None:
    """Keep ``state`` as the market's last book and send its diff from the version before.
    Call holding the market's lock."""
    cache.set(state_key(market), state, timeout=STATE_TTL_S)
    diff: BookDiff = {
        "kind": "book.diff",
        **state["meta"],
        "version": state["version"],
        "base": state["version"] - 1,
        "changed": changed,
        "removed": removed,
    }
    group_send(market_group(market), diff)
