"""Hand computations and small waits for the gateway tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal
from typing import TypeVar

from accounts.models import ChargeKind, Hold, LedgerEntry, Request

T = TypeVar("T")
HELLO = [{"role": "user", "content": "Hello there"}]  # 16 tokens with the simple template
MILLION = Decimal(1_000_000)
# The test markets' posted prices, dollars per million tokens (conftest.market_create).
INPUT, CACHED, OUTPUT = Decimal("3"), Decimal("0.3"), Decimal("15")


def token_charge_by_hand(*, prompt: int, cached: int, completion: int) -> Decimal:
    """Dollars, to the nano-dollar: uncached x $3, cached x $0.30, completion x $15 per million."""
    exact = ((prompt - cached) * INPUT + cached * CACHED + completion * OUTPUT) / MILLION
    return exact.quantize(Decimal("1E-9"))


def request_id_of(response_id: str) -> str:
    """The Request's id (the engine's rid) inside an OpenAI response id."""
    return response_id.removeprefix("chatcmpl-").removeprefix("cmpl-")


def wait_until(check: Callable[[], T], *, timeout_s: float = 10.0) -> T:
    """Poll ``check`` until it returns something truthy; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout_s} s")
        time.sleep(0.02)


def entries(request_id: str) -> list[LedgerEntry]:
    return list(LedgerEntry.objects.filter(request_id=request_id))


def token_entry(request_id: str) -> LedgerEntry:
    return LedgerEntry.objects.get(request_id=request_id, kind=ChargeKind.TOKENS)


def hold(request_id: str) -> Hold:
    return Hold.objects.get(request_id=request_id)


def request_row(request_id: str) -> Request:
    return Request.objects.get(request_id=request_id)


def lock_timeout() -> Exception:
    """What Django raises when PostgreSQL's lock_timeout ends a statement: its own
    OperationalError, the driver's LockNotAvailable (SQLSTATE 55P03) as the cause."""
    import psycopg.errors
    from django.db import OperationalError

    try:
        raise OperationalError("lock timeout") from psycopg.errors.LockNotAvailable("lock timeout")
    except OperationalError as exc:
        return exc
