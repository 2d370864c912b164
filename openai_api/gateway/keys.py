"""API keys on the hot path: ``api_key_authenticate`` behind a short-lived cache.

A key is looked up (and its ``last_used_at`` written) at most once per
``GATEWAY_API_KEY_CACHE_S`` seconds (default 5) per process; a revoked key keeps working at most
that long. Only the sha256 of a key is kept in memory, and only for keys that authenticated; a
string that is not of a key's form (``KEY_FORMAT``: too long, a NUL) is refused unhashed.
"""

from __future__ import annotations

import hashlib

from django.conf import settings

from accounts.models import ApiKey
from accounts.services import api_key_authenticate
from accounts.services.keys import api_key_well_formed
from openai_api.gateway.errors import InvalidApiKey
from openai_api.gateway.selectors import TtlCache

_api_keys: TtlCache[str, ApiKey] = TtlCache(ttl_s=lambda: settings.GATEWAY_API_KEY_CACHE_S)


def api_key_authenticated(*, key: str | None) -> ApiKey:
    """The active key ``key``, from a short-lived cache or ``api_key_authenticate``; a revoked
    key stops working within ``GATEWAY_API_KEY_CACHE_S``. InvalidApiKey otherwise."""
    if not key:
        raise InvalidApiKey("missing API key: send Authorization: Bearer <key>")
    if not api_key_well_formed(key):
        raise InvalidApiKey("invalid API key: keys read im_<12 hex>_<43 characters>")
    digest = _digest(key)
    found, api_key = _api_keys.get(digest)
    if not found:
        api_key = api_key_authenticate(key=key)
        if api_key is None:
            raise InvalidApiKey("invalid or revoked API key")
        _api_keys.put(digest, api_key)
    assert api_key is not None
    return api_key


def api_key_cached(*, key: str | None) -> ApiKey | None:
    """The key ``key`` when this process's cache holds it (no database read), else None."""
    if not key or not api_key_well_formed(key):
        return None
    found, api_key = _api_keys.get(_digest(key))
    return api_key if found else None


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def api_key_cache_clear() -> None:
    """Forget cached keys (tests; after a revocation that must apply at once)."""
    _api_keys.clear()
