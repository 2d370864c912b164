"""Figures for people: the one rule for every number a page, the admin or a message shows.

Every figure carries its unit, and says no more digits than a person can use:

- **money** (:func:`usd`): from $1 up, to the cent with thousands separated ("$1,234.57");
  under $1, three significant digits, at least the cents and at most the ledger's 9 places, no
  zeros after the cents ("$0.50", "$0.00784", "$0.0000742"), so a small amount never reads as a
  misleading $0.00; a non-zero amount under half a nano-dollar reads "< $0.000000001".
- **rates** (:func:`usd_per_s`: bids, reserves, bid sums, revenue per second): three significant
  digits, never rounding the whole part, no trailing zeros, in $/s ("0.0126 $/s", "1,235 $/s").
- **durations** (:func:`duration`: latencies, waits, time until a budget resets): under a second
  in milliseconds and under a minute in seconds, three significant digits ("84.7 ms", "2.1 s");
  from a minute on, whole units, the two largest, floored ("2 min 5 s", "28 d 9 h", "3 h").
- **plain figures** (:func:`figure`: a multiplier, a factor): three significant digits as rates;
  **counts** (:func:`count`) whole and grouped; **shares** (:func:`percent`) three significant
  digits in %.
- **as typed** (:func:`exact`): an amount a person entered (a reserve being confirmed, the
  audit's old and new) is echoed with all its digits, so what is confirmed is what was typed.

Rounding is half up on the exact decimal value: a ``Decimal`` as it is, a float by its shortest
repr (what JavaScript's ``String(x)`` writes), so the browser's copy of these rules,
``static/js/numbers.js``, writes the same text for the same value (the tests feed both one
table). None reads "—". Display only: nothing rounded here is stored or summed (the ledger's
rule is :func:`accounts.money.money`). Pure: no Django.
"""

from __future__ import annotations

from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal, localcontext

SIGNIFICANT = 3  # digits a person compares at a glance
MONEY_PLACES_MAX = 9  # the ledger's nano-dollar
NONE = "—"

Number = Decimal | float | int | str


def _decimal(value: Number) -> Decimal:
    if isinstance(value, bool):
        raise ValueError(f"not a number: {value!r}")
    if isinstance(value, float):
        value = repr(value)  # the shortest repr, as JavaScript writes it: not the binary value
    try:
        result = Decimal(value)
    except ArithmeticError as exc:
        raise ValueError(f"not a number: {value!r}") from exc
    if not result.is_finite():
        raise ValueError(f"not a finite number: {value!r}")
    return result


def _rounded(amount: Decimal, places: int) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = 80  # enough for any figure shown: quantize does the one rounding
        return amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


def _significant_places(amount: Decimal) -> int:
    """Decimal places that keep :data:`SIGNIFICANT` digits of a non-zero ``amount``, none of
    the whole part dropped."""
    return max(0, SIGNIFICANT - 1 - amount.adjusted())


def _text(amount: Decimal, *, keep: int) -> str:
    """Fixed-point text with thousands separated, zeros after ``keep`` decimals dropped."""
    text = f"{amount:,f}"
    if "." in text:
        whole, frac = text.split(".")
        frac = frac.rstrip("0").ljust(keep, "0")
        return f"{whole}.{frac}" if frac else whole
    return text


def figure(value: Number | None) -> str:
    """A plain figure to three significant digits: ``0.0014224666`` -> ``"0.00142"``."""
    if value is None:
        return NONE
    amount = _decimal(value)
    if amount == 0:
        return "0"
    shown = _rounded(abs(amount), _significant_places(abs(amount)))
    return ("-" if amount < 0 else "") + _text(shown, keep=0)


def usd(value: Number | None) -> str:
    """Dollars for people: ``9.2649`` -> ``"$9.26"``, ``0.007840`` -> ``"$0.00784"``."""
    if value is None:
        return NONE
    amount = _decimal(value)
    size = abs(amount)
    sign = "-" if amount < 0 else ""
    if size == 0:
        return "$0.00"
    places = 2 if size >= 1 else min(MONEY_PLACES_MAX, max(2, _significant_places(size)))
    shown = _rounded(size, places)
    if shown == 0:
        return f"{sign}< $0.{'0' * (MONEY_PLACES_MAX - 1)}1"
    return f"{sign}${_text(shown, keep=2)}"


def usd_apart(first: Number, second: Number) -> tuple[str, str]:
    """Two amounts one sentence compares ("$0.50 left; this request needs up to ..."): each by
    :func:`usd` when that tells them apart, else both with all their digits (at least the
    cents), so a refusal never reads "needs $0.50, $0.50 left"."""
    shown = usd(first), usd(second)
    if shown[0] != shown[1] or _decimal(first) == _decimal(second):
        return shown
    return _all_digits(_decimal(first)), _all_digits(_decimal(second))


def _all_digits(amount: Decimal) -> str:
    return f"{'-' if amount < 0 else ''}${_text(abs(amount), keep=2)}"


def usd_per_s(value: Number | None) -> str:
    """A rate in dollars per second of waiting: ``0.01258`` -> ``"0.0126 $/s"``."""
    return NONE if value is None else f"{figure(value)} $/s"


def count(value: Number | None) -> str:
    """A whole number of things, grouped: ``12345`` -> ``"12,345"`` (rounded half up)."""
    if value is None:
        return NONE
    return f"{_rounded(_decimal(value), 0) + 0:,f}"  # + 0: "-0" reads "0"


def percent(share: Number | None) -> str:
    """A share of 1 in percent, three significant digits: ``0.8234`` -> ``"82.3%"``."""
    return NONE if share is None else f"{figure(_decimal(share).scaleb(2))}%"


_UNITS = (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1))


def duration(seconds: Number | None) -> str:
    """A duration: ``0.0847`` -> ``"84.7 ms"``, ``2.104`` -> ``"2.1 s"``, ``2454360`` ->
    ``"28 d 9 h"`` (see the module's docstring)."""
    if seconds is None:
        return NONE
    amount = _decimal(seconds)
    if amount < 0:
        return "-" + duration(-amount)
    if amount == 0:
        return "0 s"
    if amount < 1:
        ms = amount.scaleb(3)
        shown = _rounded(ms, _significant_places(ms))
        if shown < 1000:
            return f"{_text(shown, keep=0)} ms"
        amount = Decimal(1)  # 999.96 ms rounds to a second
    if amount < 60:
        shown = _rounded(amount, _significant_places(amount))
        if shown < 60:
            return f"{_text(shown, keep=0)} s"
        amount = Decimal(60)  # 59.96 s rounds to a minute
    left = int(amount.to_integral_value(rounding=ROUND_FLOOR))
    parts: list[tuple[int, str]] = []
    for unit, size in _UNITS:
        if left >= size or parts:
            parts.append((left // size, unit))
            left %= size
        if len(parts) == 2:
            break
    if len(parts) == 2 and parts[1][0] == 0:
        parts.pop()
    return " ".join(f"{n} {unit}" for n, unit in parts)


def exact(value: Number | None) -> str:
    """An amount as typed, all its digits and no trailing zeros: ``0.002000000`` -> ``"0.002"``
    (for echoing what a person entered, never for measured figures)."""
    if value is None:
        return NONE
    text = format(_decimal(value), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text
