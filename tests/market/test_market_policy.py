"""A market's policy is checked against the mechanism's registry as it is, not against a list
frozen in a migration: an unknown name is refused with the names that exist, and the admin
offers exactly the policies offered for a market (the registry's ``offered``)."""

from __future__ import annotations

import pytest
from django.contrib.admin.sites import site
from django.core.exceptions import ValidationError

from market.models import Market, policy_known
from mechanism import OFFERED, POLICIES
from tests.accounts.factories import market_create


def test_every_registered_policy_is_known_and_nothing_else() -> None:
    for policy in POLICIES:
        policy_known(policy)
    for name in ("cheapest-first", "FCFS", "", "dfs_auction"):
        with pytest.raises(ValidationError) as refused:
            policy_known(name)
        assert f"{name!r} is not a policy" in refused.value.messages[0]
        assert ", ".join(POLICIES) in refused.value.messages[0]


@pytest.mark.django_db
def test_a_market_with_an_unknown_policy_fails_validation() -> None:
    market = market_create()
    market.policy = "cheapest-first"
    with pytest.raises(ValidationError) as refused:
        market.full_clean()
    assert set(refused.value.message_dict) == {"policy"}


def test_the_admin_offers_the_policies_offered_for_a_market(rf) -> None:
    admin = site._registry[Market]
    field = Market._meta.get_field("policy")
    form_field = admin.formfield_for_dbfield(field, rf.get("/"))
    assert [value for value, _ in form_field.choices] == list(OFFERED)
    assert form_field.initial == "dfs-auction-kv-split"
    assert field.choices is None  # no list frozen in the migrations
