"""The engine contract on the wire: where a request's bid travels, the auction's fields of an
answer's ``meta_info``, and the control path (a market's policy, reserve and wait bound pushed
to its engine). Both engines implement it; the engine client and the market's push use it.

- **The bid**, in dollars per second of waiting, travels as a field of ``POST /generate``:
  ``sampling_params.custom_params.bid`` (``auction_params`` writes the object). It is SGLang's
  own place for a request's custom parameters: SGLang carries it to its scheduler's ``Req``
  (``req.sampling_params.custom_params``), and SGLang's model gateway (smg), which rebuilds the
  body from its own typed request, keeps it. No bid means 0 (a client that does not bid); a bid
  that is there but not a finite number in 0..MAX_BID is refused, naming the field.
  ``auction_read`` is the one reading, used by both engines. The rid is the request's id as
  sent, the id of the round records.
- **The tenant**, for tenant-level charges (``charge_scope``), travels beside it as an opaque
  tag, ``sampling_params.custom_params.tenant`` (absent: none).
- **meta_info**: SGLang's fields (``prompt_tokens``, ``cached_tokens``, ``completion_tokens``,
  ``finish_reason``, ``ttft``, ...) plus ``AUCTION_META_FIELDS``, the bid the engine read among
  them, so that a client can tell a bid lost on the way from a bid of 0. The simulated engine
  sends each as a value; SGLang sends them through its ``customized_info`` (one value per output
  token: the plugin's value sits at the first), a list whose first item is the value;
  ``auction_value`` reads either.
- **Control**: ``POST CONTROL_PATH`` with a JSON object of ``CONTROL_FIELDS`` (any of them),
  applied from the engine's next round, with ``Authorization: Bearer <token>`` when the engine
  has an admin token; the token is ``ADMIN_TOKEN_ENV`` on both sides (the simulated engine's
  default, the market's push).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from mechanism import MAX_BID, POLICIES, bid_checked
from mechanism.aging import wait_bound_checked
from mechanism.policies import policy_checked

CUSTOM_PARAMS = "custom_params"  # the key in sampling_params
BID_PARAM = "bid"  # the key in custom_params: the bid, $/s
TENANT_PARAM = "tenant"  # the key in custom_params: the tenant's tag
PARAMS_PATH = f"sampling_params.{CUSTOM_PARAMS}"  # as errors name it
BID_PATH = f"{PARAMS_PATH}.{BID_PARAM}"
TENANT_PATH = f"{PARAMS_PATH}.{TENANT_PARAM}"
# A tenant's tag: short and plain, so that it reads the same in a log, a record and a metric.
_TENANT_TAG = re.compile(r"[A-Za-z0-9_-]{1,64}")

# The auction's meta_info fields: the bid read and the effective bid ($/s), the priority charge
# ($), round_id, position (in the admitting round's order, 0 first), planned seconds, the
# subtree it waited in (``block``, a round record's), the engine (replica) that admitted it, and
# its place in line when it joined the queue: ``rank`` (from 1), ``ahead`` (rank - 1) and
# ``queue_len`` of that round (records.AdmittedRequest). The gateway settles the priority charge
# from these: they are its only route to the ledger.
AUCTION_META_FIELDS = (
    "bid",
    "effective_bid",
    "charge",
    "round_id",
    "position",
    "planned_completion_s",
    "time_saved_s",
    "block",
    "engine",
    "rank",
    "ahead",
    "queue_len",
)

CONTROL_PATH = "/admin/market"
# An ordering policy's name; the reserve in $/s; the wait bound in seconds (0: off; an engine
# from before it reads a body without it).
CONTROL_FIELDS = ("policy", "reserve", "wait_bound_s")
ADMIN_TOKEN_ENV = "ENGINE_ADMIN_TOKEN"


class FieldError(ValueError):
    """A field an engine refuses; ``param`` names it (None: the whole body). The simulated
    engine answers it with a 400 that names ``param``."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class BidError(FieldError):
    """A request's auction field (its bid or its tenant's tag) an engine refuses; ``param``
    names it (``BID_PATH``, ``TENANT_PATH`` or ``PARAMS_PATH``)."""


@dataclass(frozen=True)
class AuctionParams:
    """What a request tells the market: its bid ($/s) and its tenant's tag ("": none)."""

    bid: float = 0.0
    owner: str = ""


def auction_params(*, bid: float, owner: str = "", request_id: str) -> dict[str, Any]:
    """The ``custom_params`` that carry request ``request_id``'s ``bid`` ($/s) and its tenant's
    tag ``owner`` ("": none; else 1-64 letters, digits, ``-`` and ``_``) to an engine;
    ValueError for a bid or tag that an engine would refuse."""
    params: dict[str, Any] = {BID_PARAM: bid_checked(bid, request_id=request_id)}
    if owner:
        if not _TENANT_TAG.fullmatch(owner):
            raise ValueError(f"a tenant tag must be 1-64 letters, digits, - or _, got {owner!r}")
        params[TENANT_PARAM] = owner
    return params


def auction_read(custom_params: object, *, request_id: str) -> AuctionParams:
    """The bid ($/s) and the tenant's tag in a request's ``sampling_params.custom_params``
    (absent or null: bid 0, no tag; other keys are not the market's and are left alone);
    BidError says what is wrong and where."""
    if custom_params is None:
        return AuctionParams()
    if not isinstance(custom_params, dict):
        raise BidError(f"{PARAMS_PATH} must be an object", PARAMS_PATH)
    given = custom_params.get(BID_PARAM)
    try:
        bid = 0.0 if given is None else bid_checked(given, request_id=request_id)
    except ValueError as exc:  # bid_checked says which rule it breaks
        raise BidError(
            f"{BID_PATH} must be a finite number of dollars per second in 0..{MAX_BID:g}, "
            f"got {_short(given)} ({exc})",
            BID_PATH,
        ) from None
    owner = custom_params.get(TENANT_PARAM)
    if owner is None:
        return AuctionParams(bid)
    if not isinstance(owner, str) or not _TENANT_TAG.fullmatch(owner):
        raise BidError(
            f"{TENANT_PATH} must be 1-64 letters, digits, - or _, got {_short(owner)}",
            TENANT_PATH,
        )
    return AuctionParams(bid, owner)


def auction_value(meta_info: Mapping[str, Any], name: str) -> Any:
    """An auction field of ``meta_info`` as a value (None: absent): SGLang's per-token list of
    ``customized_info`` gives its first item."""
    value = meta_info.get(name)
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def control_body(*, policy: str, reserve: float, wait_bound_s: float = 0.0) -> dict[str, Any]:
    """The control request's body."""
    return {"policy": policy, "reserve": reserve, "wait_bound_s": wait_bound_s}


class ControlValues(NamedTuple):
    """What a control body sets: the policy, the reserve ($/s), the wait bound (s, 0: off)."""

    policy: str
    reserve: float
    wait_bound_s: float


class ControlError(FieldError):
    """A control body an engine refuses; ``param`` names the field at fault (None: the body)."""


def control_read(
    body: object, *, policy: str, reserve: float, wait_bound_s: float = 0.0
) -> ControlValues:
    """The policy, reserve and wait bound a control body asks for, a field it leaves out keeping
    the value in effect (the keywords); ControlError for anything else, so that an engine
    refuses a bad body whole and changes nothing."""
    if not isinstance(body, dict):
        raise ControlError("the body must be a JSON object")
    unknown = sorted(set(body) - set(CONTROL_FIELDS))
    if unknown:
        raise ControlError(
            f"unknown field {unknown[0]!r}; give any of {', '.join(CONTROL_FIELDS)}", unknown[0]
        )
    try:
        policy = policy_checked(body.get("policy", policy))
    except (TypeError, ValueError):  # TypeError: a JSON list or object (not hashable)
        raise ControlError(f"policy must be one of {', '.join(POLICIES)}", "policy") from None
    try:
        reserve = bid_checked(body.get("reserve", reserve), request_id="reserve")
    except ValueError:
        raise ControlError(f"reserve must be a number in 0..{MAX_BID:g} $/s", "reserve") from None
    try:
        wait_bound_s = wait_bound_checked(body.get("wait_bound_s", wait_bound_s))
    except ValueError as exc:
        raise ControlError(str(exc), "wait_bound_s") from None
    return ControlValues(policy, reserve, wait_bound_s)


def admin_token_from_env(environ: Mapping[str, str]) -> str | None:
    """The admin token from ``ADMIN_TOKEN_ENV``, stripped; blank or unset: None (no token)."""
    return environ.get(ADMIN_TOKEN_ENV, "").strip() or None
