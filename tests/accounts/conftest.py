import pytest


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    """Personas log in a lot: a fast hasher keeps the suite quick (tests only)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
