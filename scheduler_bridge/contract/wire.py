"""The engine contract on the wire: where a request's bid travels, the auction's fields of an
answer's ``meta_info``, and the control path (a market's policy and reserve pushed to its
engine). Both engines implement it; the engine client and the market's push use it.

- **The bid**: ``sampling_params.custom_params.bid`` of SGLang's ``POST /generate``, in dollars
  per second of waiting; missing means 0.
- **meta_info**: SGLang's fields (``prompt_tokens``, ``cached_tokens``, ``completion_tokens``,
  ``finish_reason``, ``ttft``, ...) plus ``AUCTION_META_FIELDS`` from an engine that prices the
  request in-band (the simulated engine; SGLang's answers do not carry them, and the charge then
  comes from the round record only).
- **Control**: ``POST CONTROL_PATH`` with a JSON object of ``CONTROL_FIELDS`` (either or both),
  applied from the engine's next round, with ``Authorization: Bearer <token>`` when the engine
  has an admin token; the token is ``ADMIN_TOKEN_ENV`` on both sides (the simulated engine's
  default, the market's push).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from market.mechanism import MAX_BID, POLICIES, bid_checked
from market.mechanism.policies import policy_checked

CUSTOM_PARAMS = "custom_params"  # the key in sampling_params
BID_PARAM = "bid"  # the key in custom_params
BID_PATH = f"sampling_params.{CUSTOM_PARAMS}.{BID_PARAM}"  # as errors name it

# The auction's meta_info fields: charge ($), round_id, position (0 first), planned seconds.
AUCTION_META_FIELDS = ("charge", "round_id", "position", "planned_completion_s", "time_saved_s")

CONTROL_PATH = "/admin/market"
CONTROL_FIELDS = ("policy", "reserve")  # an ordering policy's name; the reserve in $/s
ADMIN_TOKEN_ENV = "ENGINE_ADMIN_TOKEN"


def sampling_with_bid(sampling_params: Mapping[str, Any] | None, bid: float) -> dict[str, Any]:
    """A copy of ``sampling_params`` carrying ``bid`` ($/s) where the engines read it."""
    sampling = dict(sampling_params or {})
    sampling[CUSTOM_PARAMS] = {BID_PARAM: bid}
    return sampling


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
