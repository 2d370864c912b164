"""The engine contract on the wire: where a request's bid travels, the auction's fields of an
answer's ``meta_info``, and the control path (a market's policy and reserve pushed to its
engine). Both engines implement it; the engine client and the market's push use it.

- **The bid**, in dollars per second of waiting, travels in the request's ``rid``:
  ``<request id>~bid=<bid>`` (``rid_with_bid``). The rid is the one field of ``POST /generate``
  that reaches SGLang's scheduler through SGLang's router (which rebuilds the body from its own
  typed struct and drops ``sampling_params.custom_params``) and through SGLang's tokenizer
  manager (which keeps ``custom_labels`` to itself). A client talking to one engine directly may
  put the bid in ``sampling_params.custom_params.bid`` instead; given in both, they must agree.
  Neither means 0. ``bid_read`` is the one reading, used by both engines; the request's id in
  the round records is the rid without its bid part.
- **The tenant**, for tenant-level charges (``charge_scope``), travels beside it as an opaque
  tag: ``<request id>~t=<tag>~bid=<bid>`` (``rid_owner`` reads it; "" when absent). The request's
  id is the rid without both parts.
- **meta_info**: SGLang's fields (``prompt_tokens``, ``cached_tokens``, ``completion_tokens``,
  ``finish_reason``, ``ttft``, ...) plus ``AUCTION_META_FIELDS``, the bid the engine read among
  them, so that a client can tell a bid lost on the way from a bid of 0. The simulated engine
  sends each as a value; SGLang sends them through its ``customized_info`` (one value per output
  token: the plugin's value sits at the first), a list whose first item is the value;
  ``auction_value`` reads either.
- **Control**: ``POST CONTROL_PATH`` with a JSON object of ``CONTROL_FIELDS`` (either or both),
  applied from the engine's next round, with ``Authorization: Bearer <token>`` when the engine
  has an admin token; the token is ``ADMIN_TOKEN_ENV`` on both sides (the simulated engine's
  default, the market's push).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from market.mechanism import MAX_BID, POLICIES, bid_checked
from market.mechanism.policies import policy_checked

CUSTOM_PARAMS = "custom_params"  # the key in sampling_params
BID_PARAM = "bid"  # the key in custom_params
BID_PATH = f"sampling_params.{CUSTOM_PARAMS}.{BID_PARAM}"  # as errors name it
RID_BID_MARK = "~bid="  # between the request's id and its bid in the rid
RID_OWNER_MARK = "~t="  # before the bid mark: the request's tenant tag
_RID_OWNER = re.compile(r"[A-Za-z0-9_-]{1,64}")
# What may follow the mark: a plain decimal number, as Python's repr writes a float.
_RID_BID = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?")

# The auction's meta_info fields: the bid read and the effective bid ($/s), the priority charge
# ($), round_id, position (0 first), planned seconds, the subtree it waited in (``block``, a
# round record's) and the engine (replica) that admitted it. The gateway settles the priority
# charge from these: they are its only route to the ledger.
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
)

CONTROL_PATH = "/admin/market"
CONTROL_FIELDS = ("policy", "reserve")  # an ordering policy's name; the reserve in $/s
ADMIN_TOKEN_ENV = "ENGINE_ADMIN_TOKEN"


class BidError(ValueError):
    """A bid an engine refuses; ``param`` names where it was (``rid`` or ``BID_PATH``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def rid_with_bid(request_id: str, bid: float, owner: str = "") -> str:
    """The rid that carries ``request_id``, its ``bid`` ($/s) and its tenant's tag ``owner``
    ("": none; letters, digits, ``-`` and ``_``) to an engine."""
    if not request_id or RID_BID_MARK in request_id or RID_OWNER_MARK in request_id:
        raise ValueError(
            f"a request id must be non-empty, without {RID_BID_MARK!r} or {RID_OWNER_MARK!r}"
        )
    if owner and not _RID_OWNER.fullmatch(owner):
        raise ValueError(f"a tenant tag must be 1-64 letters, digits, - or _, got {owner!r}")
    tag = f"{RID_OWNER_MARK}{owner}" if owner else ""
    return f"{request_id}{tag}{RID_BID_MARK}{bid_checked(bid, request_id=request_id)!r}"


def _split_owner(head: str) -> tuple[str, str]:
    """(request id, tenant tag) of a rid's part before its bid mark."""
    request_id, mark, owner = head.rpartition(RID_OWNER_MARK)
    if mark and request_id and _RID_OWNER.fullmatch(owner):
        return request_id, owner
    return head, ""


def rid_request_id(rid: str) -> str:
    """The request's id in a rid: the rid without its tenant and bid parts."""
    head = rid.rpartition(RID_BID_MARK)[0]
    return _split_owner(head)[0] if head else rid


def rid_owner(rid: str) -> str:
    """The tenant tag a rid carries, "" when none."""
    head = rid.rpartition(RID_BID_MARK)[0]
    return _split_owner(head)[1] if head else ""


def rid_read(rid: str) -> tuple[str, float | None]:
    """The request's id and the bid ($/s) of a rid (None: the rid carries no bid); BidError
    when it has the mark but not a valid bid after it (a rid mangled on the way)."""
    head, mark, text = rid.rpartition(RID_BID_MARK)
    if not mark:
        return rid, None
    request_id = _split_owner(head)[0] if head else head
    if not request_id or not _RID_BID.fullmatch(text):
        raise BidError(
            f"rid {rid!r} has {RID_BID_MARK!r} but not <request id>{RID_BID_MARK}<decimal $/s>",
            "rid",
        )
    try:
        return request_id, bid_checked(float(text), request_id=request_id)
    except ValueError as exc:
        raise BidError(
            f"the bid in rid {rid!r} must be in 0..{MAX_BID:g} dollars per second ({exc})", "rid"
        ) from None


def bid_read(rid: str, custom_params: object) -> tuple[str, float]:
    """The request's id and its bid ($/s), from its ``rid`` and ``custom_params`` (either may
    carry it; both must then agree; neither: 0). BidError says what is wrong and where."""
    request_id, in_rid = rid_read(rid)
    if custom_params is None:
        custom_params = {}
    if not isinstance(custom_params, dict):
        raise BidError(
            f"sampling_params.{CUSTOM_PARAMS} must be an object", f"sampling_params.{CUSTOM_PARAMS}"
        )
    given = custom_params.get(BID_PARAM)
    if given is None:
        return request_id, 0.0 if in_rid is None else in_rid
    try:
        in_params = bid_checked(given, request_id=request_id)
    except ValueError as exc:  # bid_checked says which rule it breaks
        raise BidError(
            f"{BID_PATH} must be a finite number of dollars per second in 0..{MAX_BID:g}, "
            f"got {_short(given)} ({exc})",
            BID_PATH,
        ) from None
    if in_rid is not None and in_rid != in_params:
        raise BidError(
            f"the bid in the rid ({in_rid!r}) and {BID_PATH} ({in_params!r}) differ", BID_PATH
        )
    return request_id, in_params


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


def control_body(*, policy: str, reserve: float) -> dict[str, Any]:
    """The control request's body."""
    return {"policy": policy, "reserve": reserve}


class ControlError(ValueError):
    """A control body an engine refuses; ``param`` names the field at fault (None: the body)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def control_read(body: object, *, policy: str, reserve: float) -> tuple[str, float]:
    """The policy and reserve a control body asks for, a field it leaves out keeping the value
    in effect (``policy``, ``reserve``); ControlError for anything else, so that an engine
    refuses a bad body whole and changes nothing."""
    if not isinstance(body, dict):
        raise ControlError("the body must be a JSON object")
    unknown = sorted(set(body) - set(CONTROL_FIELDS))
    if unknown:
        raise ControlError(f"unknown field {unknown[0]!r}; give policy and/or reserve", unknown[0])
    try:
        policy = policy_checked(body.get("policy", policy))
    except (TypeError, ValueError):  # TypeError: a JSON list or object (not hashable)
        raise ControlError(f"policy must be one of {', '.join(POLICIES)}", "policy") from None
    try:
        reserve = bid_checked(body.get("reserve", reserve), request_id="reserve")
    except ValueError:
        raise ControlError(f"reserve must be a number in 0..{MAX_BID:g} $/s", "reserve") from None
    return policy, reserve


def admin_token_from_env(environ: Mapping[str, str]) -> str | None:
    """The admin token from ``ADMIN_TOKEN_ENV``, stripped; blank or unset: None (no token)."""
    return environ.get(ADMIN_TOKEN_ENV, "").strip() or None
