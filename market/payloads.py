"""Websocket payloads: the ONE contract shared by the producers and the consumers.

Producers (``market.live``: the round-record publisher, the periodic engine-status and spend
publisher) build these payloads and send them to a Channels group wrapped in a channel-layer
message ``{"type": <handler>, "payload": <payload>}``; the consumers (``market.consumers``) have
one handler per message type and forward the payload to the browser as JSON, unchanged. Every
payload says what it is in ``kind``, which the browser code dispatches on.

Groups:

- ``market.<slug>``: a market's operators (staff): order-book snapshots and diffs, round
  results, engine status;
- ``operators``: every operator console: tenants' spend lines;
- ``tenant.<slug>``: a tenant's members (and staff): that tenant's spend ticks only;
- ``user.<id>``: every open socket of one user: ``access.changed``, which the consumers act on
  (they re-check the user's access and close when it is gone) and never forward to the browser.

Units: bids and reserve in dollars per second of waiting ($/s), density in $/s per token,
ledger amounts in dollars as exact decimal strings (``"0.000120000"``), engine charges and
welfare in dollars as floats, latencies in seconds, times (``at``) in Unix seconds.

The order book is aggregated: a row is a prefix subtree with counts and sums, never a request
id or a single request's bid. It goes to operators only (``market.<slug>``), and for them a row
also counts its requests by tenant; nothing of the book reaches a tenant's socket.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

# --- groups -----------------------------------------------------------------------------------

OPERATORS_GROUP = "operators"


def market_group(market_slug: str) -> str:
    """The Channels group of one market's console watchers (staff)."""
    return f"market.{market_slug}"


def tenant_group(tenant_slug: str) -> str:
    """The Channels group of one tenant's dashboard watchers (its members, and staff)."""
    return f"tenant.{tenant_slug}"


def user_group(user_id: int) -> str:
    """The Channels group of every open socket of one user (``access.changed``)."""
    return f"user.{user_id}"


# --- the order book ---------------------------------------------------------------------------


class BookRow(TypedDict):
    """One prefix subtree of a market's waiting queue, aggregated (no request, no single bid)."""

    key: str  # stable id of the subtree's prefix: the row's identity across rounds
    label: str  # readable start of the prefix (decoded text)
    parent: NotRequired[str]  # the parent subtree's key ("" below the root)
    branch: NotRequired[str]  # readable start of its own edge: where it leaves its parent
    depth: int  # 1 for a child of the root, 2 below it
    prefix_tokens: int  # tokens from the root to the end of the subtree's edge
    cached_tokens: int  # of those, already in the KV cache
    requests: int  # waiting requests in the subtree
    bid_sum: float  # $/s, effective bids (under the reserve count as 0)
    bid_mean: float  # $/s
    # $/s: the age credits its requests have earned by waiting (the wait bound): ranked as bid
    # by the DFS auctions, never paid
    credit_sum: float
    density: float  # $/s per uncached token of the subtree's work, bids and credits
    rank: int  # place among its siblings in the round's order, 0 first
    position: int  # place of its first request in the round's whole (DFS) order, 0 first
    # A market of replicas: the requests each replica (engine id) holds in the subtree.
    replicas: NotRequired[dict[str, int]]
    # Its requests by tenant slug ("": requests that came without a tenant's tag).
    tenants: NotRequired[dict[str, int]]


class BookMeta(TypedDict):
    """Where a book comes from: the round that reported it."""

    market: str  # market slug
    version: int  # increases by one with every published snapshot or diff of this market
    round_id: str  # the engine round whose queue this is
    # Each engine's latest round (its seq) in the book, by engine id: of a market of replicas,
    # what the console shows (they report in turn: round_id alone jumps between their rounds).
    rounds: NotRequired[dict[str, int]]
    at: float  # Unix seconds, the engine's clock at that round
    waiting: int  # requests waiting when the round cleared
    policy: str
    reserve: float  # $/s, the reserve that round used


class BookSnapshot(BookMeta):
    """The whole book (sent on connect and on a browser's resync request)."""

    kind: Literal["book.snapshot"]
    rows: list[BookRow]


class BookDiff(BookMeta):
    """What changed since version ``base``: rows added or changed (whole rows), keys removed.

    A browser applies it only when it holds version ``base``; otherwise it asks for a snapshot
    (``{"type": "book.resync"}``). Rows that did not change are not sent.
    """

    kind: Literal["book.diff"]
    base: int
    changed: list[BookRow]
    removed: list[str]


# --- rounds and the engine --------------------------------------------------------------------


class RoundResult(TypedDict):
    """The rounds of one market settled since the previous result (one or more rounds)."""

    kind: Literal["round.result"]
    market: str
    at: float  # Unix seconds, engine clock of the last round
    round_id: str  # the last round
    rounds: int  # rounds summarized
    admitted: int  # requests admitted in them
    revenue: float  # dollars: their priority charges, as the engine priced them
    welfare: float  # dollars: planned welfare (mechanism.welfare.planned_welfare)
    waiting: int  # requests waiting when the last round cleared
    policy: str  # the last round's policy
    reserve: float  # $/s, the reserve the last round used (a new one shows here once applied)


class ReplicaStatus(TypedDict):
    """One replica's part of its market's status (``EngineStatus.replicas``)."""

    engine_id: str
    url: str
    up: bool
    error: str
    queue: int | None
    running: int | None
    cache_hit_rate: float | None
    tokens_per_second: float | None
    prompt_tokens_per_second: float | None
    ttft_p50_s: float | None
    window_s: float | None


class EngineStatus(TypedDict):
    """One scrape of a market's engine ``/metrics`` (SGLang's names); of a market of replicas,
    the fleet's, with each replica's in ``replicas``."""

    kind: Literal["engine.status"]
    market: str
    at: float  # Unix seconds of the scrape
    up: bool  # the engine answered
    error: str  # why not, when not up; "" otherwise
    queue: int | None  # requests waiting
    running: int | None  # requests admitted and not finished
    cache_hit_rate: float | None  # 0..1, cached share of admitted prompt tokens
    tokens_per_second: float | None  # generated tokens per second, over the last window
    prompt_tokens_per_second: float | None  # admitted prompt tokens per second, same window
    ttft_p50_s: float | None  # seconds, over the last window (None: no request finished)
    ttft_p99_s: float | None
    window_s: float | None  # seconds the rates and quantiles cover
    replicas: NotRequired[list[ReplicaStatus]]  # a market of replicas: each one's


# --- spend ------------------------------------------------------------------------------------


class BudgetLine(TypedDict):
    """A tenant's own budget (not its keys') in its current window. Amounts: dollar strings."""

    period: str  # day, week, month or none
    limit: str
    spent: str
    held: str
    remaining: str
    window_start: float  # Unix seconds
    resets_at: float | None  # Unix seconds; None: never resets


class RequestRow(TypedDict):
    """One of the tenant's requests, with why it ranked where it did (tenant-private)."""

    request_id: str
    at: float  # Unix seconds it arrived at the gateway
    market: str
    request_class: str
    status: str  # queued, served or failed
    bid: str  # $/s as sent
    bid_source: str  # explicit, autobid or none
    effective_bid: float | None  # $/s, 0 when under the reserve; None before admission
    position: int | None  # place in the order of the round that admitted it, 0 first
    # Its place in line when it joined the queue (the first round that ordered it): 1 first;
    # the requests planned ahead of it; the requests waiting then. None before admission, or
    # from an engine that does not report them.
    rank: int | None
    ahead: int | None
    queue_len: int | None
    block_bid_mean: float | None  # $/s, the average bid of the subtree it waited in
    block_density: float | None  # $/s per token, that subtree's bid density
    block_requests: int | None  # requests in that subtree
    engine: str | None  # the replica whose queue it waited in (its round record's engine)
    time_saved_s: float | None  # planned seconds its bid saved over bidding 0
    priority_charge: str | None  # dollars
    token_charge: str | None  # dollars
    ttft_s: float | None  # seconds, as the engine measured
    e2e_s: float | None


class AutobidderPoint(TypedDict):
    at: float  # Unix seconds of the pacing step
    mu: float  # the multiplier after it: bids are value / (1 + mu)
    spent: str  # dollars its budget had paid in its window by then (the spend path)


class SpendTick(TypedDict):
    """A tenant's spend now, and the requests whose charges just settled."""

    kind: Literal["spend.tick"]
    tenant: str  # tenant slug
    at: float  # Unix seconds
    budget: BudgetLine | None
    spent_window: str  # dollars in the budget's window (this UTC month without a budget)
    spent_today: str  # dollars since 00:00 UTC
    autobidder: AutobidderPoint | None  # its latest step
    requests: list[RequestRow]


class TenantSpend(TypedDict):
    """A tenant's spend line for the operators' tenants table."""

    kind: Literal["tenant.spend"]
    tenant: str  # slug
    name: str
    at: float
    budget: BudgetLine | None
    spent_today: str


# --- access: for the consumers only ------------------------------------------------------------


AccessReason = Literal["membership", "user", "logout"]


class AccessChanged(TypedDict):
    """A user's access may have changed (a membership, the user itself, a logout): each of its
    sockets re-checks it and closes when it is gone. Never sent to the browser."""

    kind: Literal["access.changed"]
    user: int  # the user's id
    reason: AccessReason


Payload = (
    BookSnapshot | BookDiff | RoundResult | EngineStatus | SpendTick | TenantSpend | AccessChanged
)

# --- channel-layer messages: the ``type`` names the consumer's handler ------------------------

HANDLERS: dict[str, str] = {
    "book.snapshot": "book_snapshot",
    "book.diff": "book_diff",
    "round.result": "round_result",
    "engine.status": "engine_status",
    "spend.tick": "spend_tick",
    "tenant.spend": "tenant_spend",
    "access.changed": "access_changed",
}


class LayerMessage(TypedDict):
    """What travels through the channel layer: ``type`` (== the payload's ``kind``, which
    Channels turns into the handler ``book_snapshot`` etc.) and the payload."""

    type: str
    payload: Payload


def layer_message(payload: Payload) -> LayerMessage:
    """Wrap ``payload`` for ``group_send``; its ``kind`` picks the consumer's handler."""
    if payload["kind"] not in HANDLERS:
        raise ValueError(f"unknown payload kind {payload['kind']!r}")
    return {"type": payload["kind"], "payload": payload}
