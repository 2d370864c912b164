"""The market's knobs: what an engine needs from the market to run its auction, defined once.

Both engines embed one ``MarketKnobs`` in their configuration (the simulated engine's
``ServerOptions`` and ``Engine``, the SGLang plugin's ``PluginConfig``), so a knob has one name,
one default and one check whichever engine runs the market. The engine's own parameters (the
simulated engine's cost model, the plugin's Redis URL) stay in the engine's config.

Units: the reserve in dollars per second of waiting, rates in tokens per second, intervals in
seconds. ``reserve`` and ``wait_bound_s`` (with the policy) are what the console's control
path changes while the engine runs; ``with_reserve`` and ``with_wait_bound`` give the knobs with
a new one, checked the same way.

``assigned`` applies ``name=value`` text (the command lines' ``--set``) to any frozen dataclass
of numbers and flags, so both configurations parse overrides by one rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from mechanism import DFS_AUCTIONS, MAX_BID
from mechanism.aging import DEFAULT_DENSITY, DEFAULT_STEPS, AgeCredit, wait_bound_checked
from mechanism.clearing import REQUEST_SCOPE, charge_scope_checked

from .records import DEFAULT_STREAM


@dataclass(frozen=True)
class MarketKnobs:
    """The market's settings that both engines read; checked when built."""

    market: str = "default"  # the market's slug, in every round record
    reserve: float = 0.0  # $/s of waiting; a bid below it counts as 0
    # The prefill rate the plan converts work to time with; None: the engine's own estimate (the
    # simulated engine's cost model, or the mechanism's default where the engine has none).
    tokens_per_second: float | None = None
    overhead_tokens: int = 1  # per-request work in the plan (its own last token)
    # A DFS auction keeps a request that would recompute at least this many uncached tokens it
    # shares with a request already in the prefill batch for the next batch; 0 turns it off.
    in_batch_defer_tokens: int = 32
    # A DFS auction's cache evicts by the round's order (eviction.py): leaves no waiting request
    # needs first, then the prefixes needed last; False: the cache's own LRU.
    evict_by_order: bool = True
    book_interval_s: float | None = 0.5  # subtrees in a record at most this often; None: never
    rounds_stream: str = DEFAULT_STREAM  # the Redis stream of round records
    # "request": a request pays for the delay it imposes on every other request; "tenant": not
    # on its own tenant's (mechanism.payments.TenantCharges; needs each request's owner).
    charge_scope: str = REQUEST_SCOPE
    # Bounded waiting (mechanism.aging), under the DFS auctions only: a request that has waited
    # ``wait_bound_s`` seconds ranks as if it bid ``wait_density`` $/s per prompt token more,
    # reached in ``wait_steps`` equal steps; 0 s turns it off (the operator's control).
    wait_bound_s: float = 0.0
    wait_steps: int = DEFAULT_STEPS
    wait_density: float = DEFAULT_DENSITY

    def __post_init__(self) -> None:
        for name in ("market", "rounds_stream"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        _number(self.reserve, "reserve", low=0.0, high=MAX_BID)
        charge_scope_checked(self.charge_scope)
        if self.tokens_per_second is not None:
            _number(self.tokens_per_second, "tokens_per_second", low=0.0, strict=True)
        integer_checked(self.overhead_tokens, "overhead_tokens")
        integer_checked(self.in_batch_defer_tokens, "in_batch_defer_tokens")
        if not isinstance(self.evict_by_order, bool):
            raise ValueError(f"evict_by_order must be true or false, got {self.evict_by_order!r}")
        if self.book_interval_s is not None:
            _number(self.book_interval_s, "book_interval_s", low=0.0)
        object.__setattr__(self, "reserve", float(self.reserve))
        object.__setattr__(self, "wait_bound_s", wait_bound_checked(self.wait_bound_s))
        integer_checked(self.wait_steps, "wait_steps", low=1)
        _number(self.wait_density, "wait_density", low=0.0, high=MAX_BID, strict=True)

    def with_reserve(self, reserve: object) -> MarketKnobs:
        """These knobs with another reserve; ValueError if it is not a valid one."""
        return replace(self, reserve=reserve)  # type: ignore[arg-type]  # checked by __post_init__

    def with_wait_bound(self, wait_bound_s: object) -> MarketKnobs:
        """These knobs with another wait bound (seconds, 0: off); ValueError if not a valid one."""
        return replace(self, wait_bound_s=wait_bound_s)  # type: ignore[arg-type]  # checked

    def age_credit(self, policy: str) -> AgeCredit | None:
        """The age credit rule a round runs under ``policy``: None when the bound is off or the
        policy is not a DFS auction (only their block keys take a credit; the others ignore it)."""
        if not self.wait_bound_s or policy not in DFS_AUCTIONS:
            return None
        return AgeCredit(self.wait_bound_s, self.wait_density, self.wait_steps)

    def plan_rate(self, engine_estimate: float) -> float:
        """The tokens per second the plan uses: the knob, or else the engine's estimate."""
        return engine_estimate if self.tokens_per_second is None else self.tokens_per_second


KNOB_NAMES = frozenset(f.name for f in fields(MarketKnobs))


def split_knobs(values: Mapping[str, Any]) -> tuple[MarketKnobs, dict[str, Any]]:
    """The knobs named in ``values`` (checked) and the other entries, for the engine's config."""
    knobs = {k: v for k, v in values.items() if k in KNOB_NAMES}
    return MarketKnobs(**knobs), {k: v for k, v in values.items() if k not in KNOB_NAMES}


Config = TypeVar("Config")


def assigned(config: Config, assignments: Iterable[str], *, what: str) -> Config:
    """A copy of the dataclass ``config`` with ``name=value`` texts applied.

    ValueError names an unknown setting (``what`` says whose) or a value of the wrong kind.
    """
    kinds = {f.name: f.type for f in fields(config)}  # type: ignore[arg-type]
    changes: dict[str, object] = {}
    for item in assignments:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in kinds:
            raise ValueError(f"unknown {what} setting {item!r}; known: {', '.join(kinds)}")
        changes[name] = _parsed(name, str(kinds[name]), raw.strip())
    return replace(config, **changes)  # type: ignore[type-var]


def _parsed(name: str, kind: str, raw: str) -> object:
    optional = "None" in kind
    if optional and raw.lower() in ("none", "null", ""):
        return None
    base = kind.replace("| None", "").strip()
    try:
        if base == "bool":
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        if base == "int":
            return int(raw)
        if base == "float":
            return float(raw)
        return raw
    except ValueError as exc:
        raise ValueError(f"setting {name} needs a {base}, got {raw!r}") from exc


def _number(
    value: Any, name: str, *, low: float, high: float = math.inf, strict: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < low or (strict and value == low):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {low:g}, got {value!r}")
    if value > high:
        raise ValueError(f"{name} must be <= {high:g}, got {value!r}")


def integer_checked(value: Any, name: str, *, low: int = 0) -> None:
    """ValueError naming ``name`` unless ``value`` is an integer (not a bool) >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
