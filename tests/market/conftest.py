import uuid

import pytest


@pytest.fixture
def unique_slug() -> str:
    """A market slug no other test (or run sharing this Redis) uses."""
    return f"test-{uuid.uuid4().hex[:12]}"
