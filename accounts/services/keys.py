"""API keys: created with their secret shown once, stored hashed, revocable.

A key reads ``im_<prefix>_<secret>``: 12 hex characters of visible prefix (finds the row) and
256 random bits of secret. Only sha256(key) is stored; comparisons are constant-time. Anything
not of that form (:data:`KEY_FORMAT`: a key too long, a NUL in it) is refused before any lookup.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime
from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from accounts.models import ApiKey, Period, Tenant
from accounts.services.budgets import budget_set

KEY_SCHEME = "im"
PREFIX_HEX = 12  # secrets.token_hex(6)
SECRET_BYTES = 32  # secrets.token_urlsafe(32): 43 characters of URL-safe base64
KEY_FORMAT = re.compile(rf"{KEY_SCHEME}_([0-9a-f]{{{PREFIX_HEX}}})_[A-Za-z0-9_-]{{43}}")


def api_key_well_formed(key: str) -> bool:
    """Whether ``key`` has the form of a key this module creates (nothing else is looked up)."""
    return KEY_FORMAT.fullmatch(key) is not None


def _key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    created_by: AbstractBaseUser | None,
    budget_limit: Decimal | str | None = None,
    budget_period: str = Period.MONTH,
    now: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key for ``tenant``; returns it with its full secret, which is never stored.

    With ``budget_limit`` (dollars per ``budget_period``), the key gets a budget of its own, on
    top of the tenant's.
    """
    name = name.strip()
    if not name or len(name) > 100:
        raise ValueError("a key needs a name of 1 to 100 characters")
    prefix = secrets.token_hex(PREFIX_HEX // 2)
    key = f"{KEY_SCHEME}_{prefix}_{secrets.token_urlsafe(SECRET_BYTES)}"
    with transaction.atomic():
        api_key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            prefix=prefix,
            secret_hash=_key_hash(key),
            created_by=created_by
            if created_by is not None and created_by.is_authenticated
            else None,
            created_at=now or timezone.now(),
        )
        if budget_limit is not None:
            budget_set(tenant=tenant, api_key=api_key, limit=budget_limit, period=budget_period)
    return api_key, key


def api_key_revoke(*, api_key: ApiKey, now: datetime | None = None) -> bool:
    """Revoke ``api_key`` (it stops authenticating at once). False when it already was."""
    now = now or timezone.now()
    revoked = ApiKey.objects.filter(pk=api_key.pk, revoked_at=None).update(revoked_at=now)
    api_key.refresh_from_db(fields=["revoked_at"])
    return revoked == 1


def api_key_authenticate(*, key: str, now: datetime | None = None) -> ApiKey | None:
    """The active key whose secret is ``key``, or None; records when it was last used."""
    well_formed = KEY_FORMAT.fullmatch(key)
    if well_formed is None:
        return None
    prefix = well_formed.group(1)
    api_key = ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()
    if api_key is None or not hmac.compare_digest(api_key.secret_hash, _key_hash(key)):
        return None
    if api_key.revoked_at is not None:
        return None
    api_key.last_used_at = now or timezone.now()
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=api_key.last_used_at)
    return api_key
