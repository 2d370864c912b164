"""API keys: the secret is shown once and stored only as a hash; revoked keys stop working."""

import hashlib
import re
from datetime import timedelta

import pytest

from accounts.models import ApiKey, Budget
from accounts.services import api_key_authenticate, api_key_create, api_key_revoke
from tests.accounts.factories import NOW, tenant_create, user_create

pytestmark = pytest.mark.django_db


def test_a_new_key_is_shown_once_and_stored_hashed() -> None:
    tenant = tenant_create("acme")
    creator = user_create("alice", tenant=tenant)
    key, secret = api_key_create(tenant=tenant, name=" ci bot ", created_by=creator, now=NOW)
    assert re.fullmatch(r"im_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", secret)
    assert secret.split("_")[1] == key.prefix
    assert key.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert (key.name, key.created_by, key.created_at, key.is_active) == (
        "ci bot",
        creator,
        NOW,
        True,
    )
    # The secret itself is in no column of the row.
    row = ApiKey.objects.filter(pk=key.pk).values().get()
    assert all(secret not in str(value) for value in row.values())
    assert secret.split("_", 2)[2] not in str(row)
    assert key.display == f"im_{key.prefix}_..."


def test_keys_are_distinct() -> None:
    tenant = tenant_create("acme")
    secrets = {api_key_create(tenant=tenant, name=f"k{i}", created_by=None)[1] for i in range(20)}
    assert len(secrets) == 20


def test_authenticate_accepts_the_key_and_nothing_else() -> None:
    tenant = tenant_create("acme")
    key, secret = api_key_create(tenant=tenant, name="k", created_by=None)
    found = api_key_authenticate(key=secret, now=NOW)
    assert found is not None and found.pk == key.pk and found.tenant == tenant
    assert ApiKey.objects.get(pk=key.pk).last_used_at == NOW
    tampered = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    for wrong in [tampered, "", "im_", f"im_{key.prefix}_", "sk-" + secret, secret + "x"]:
        assert api_key_authenticate(key=wrong) is None, wrong


def test_a_revoked_key_stops_authenticating() -> None:
    tenant = tenant_create("acme")
    key, secret = api_key_create(tenant=tenant, name="k", created_by=None)
    assert api_key_revoke(api_key=key, now=NOW) is True
    assert api_key_revoke(api_key=key, now=NOW + timedelta(hours=1)) is False
    assert ApiKey.objects.get(pk=key.pk).revoked_at == NOW  # the first revocation is kept
    assert api_key_authenticate(key=secret) is None


def test_a_key_can_have_its_own_budget() -> None:
    tenant = tenant_create("acme")
    key, _ = api_key_create(
        tenant=tenant, name="k", created_by=None, budget_limit="2.5", budget_period="week"
    )
    budget = Budget.objects.get(api_key=key)
    assert (budget.tenant, str(budget.limit), budget.period) == (tenant, "2.500000000", "week")


def test_a_key_needs_a_name() -> None:
    with pytest.raises(ValueError):
        api_key_create(tenant=tenant_create("acme"), name="  ", created_by=None)
