"""The personas of every "who sees and changes what" test, defined once.

Tenant A (``acme``) and tenant B (``globex``); A's admin and A's viewer, B's admin, an operator
(staff) and an anonymous visitor (``PERSONAS``); one market. The pages and JSON API
(``tests/accounts/test_personas.py``), the dashboard and batches
(``tests/openai_api/batches/test_batch_console.py``), the console and its websockets
(``tests/market/``, ``tests/config/test_embedded.py``) use :func:`world_create`; the gateway's
tests use a tenant's program (:func:`program_create`: its API key and secret, and a budget).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import openai
from django.contrib.auth.models import AbstractUser
from django.test import Client

from accounts.models import ApiKey, Role, Tenant
from accounts.services import api_key_create, budget_set
from market.models import Market
from tests.accounts.factories import PASSWORD, market_create, tenant_create, user_create
from tests.conftest import DaphneThread

PERSONAS = ("operator", "a_admin", "a_viewer", "b_admin", "anonymous")


@dataclass
class World:
    """Tenant A (acme) and B (globex), their members, an operator, and one market."""

    a: Tenant
    b: Tenant
    market: Market
    users: dict[str, AbstractUser]  # by persona, all but "anonymous"


def world_create(market_slug: str = "test-llm") -> World:
    a, b = tenant_create("acme"), tenant_create("globex")
    users = {
        "operator": user_create("operator", staff=True),
        "a_admin": user_create("a_admin", tenant=a, role=Role.ADMIN),
        "a_viewer": user_create("a_viewer", tenant=a, role=Role.VIEWER),
        "b_admin": user_create("b_admin", tenant=b, role=Role.ADMIN),
    }
    return World(a=a, b=b, market=market_create(market_slug), users=users)


def logged_in(client: Client, world: World, persona: str) -> Client:
    """``client`` logged in as ``persona`` (left anonymous for "anonymous")."""
    if persona != "anonymous":
        client.force_login(world.users[persona])
    return client


def login(client: Client, persona: str) -> None:
    """Log ``client`` in with ``persona``'s password, as a browser does (not for anonymous)."""
    if persona != "anonymous":
        assert client.login(username=persona, password=PASSWORD)


@dataclass
class Program:
    """A tenant's program: its API key (and the key's secret) and a budget."""

    tenant: Tenant
    api_key: ApiKey
    key: str

    def client(self, gateway: DaphneThread, **kwargs) -> openai.OpenAI:
        """The official client, pointed at the gateway, no retries."""
        return openai.OpenAI(
            base_url=f"{gateway.url}/v1", api_key=self.key, max_retries=0, timeout=30, **kwargs
        )

    def http(self, gateway: DaphneThread) -> httpx.Client:
        return httpx.Client(
            base_url=gateway.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30
        )


def program_create(slug: str, *, budget: str = "100") -> Program:
    """A tenant ``slug`` (created, or the world's) with a monthly budget and an API key."""
    tenant = Tenant.objects.filter(slug=slug).first() or tenant_create(slug)
    budget_set(tenant=tenant, limit=budget, period="month")
    api_key, key = api_key_create(tenant=tenant, name="program", created_by=None)
    return Program(tenant=tenant, api_key=api_key, key=key)
