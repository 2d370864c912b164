import pytest

from tests.accounts.factories import market_create, tenant_create


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    """Personas log in a lot: a fast hasher keeps the suite quick (tests only)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def market():
    """The factories' market: $3 / $0.30 / $15 per million tokens, no reserve."""
    return market_create()


@pytest.fixture
def tenant():
    return tenant_create("acme")
