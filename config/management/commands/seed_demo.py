"""``manage.py seed_demo``: the demo operator, tenants and market. Running it twice changes
nothing."""

from typing import Any

from django.core.management.base import BaseCommand

from accounts.services import demo_accounts_seed
from market.services import market_demo_seed


class Command(BaseCommand):
    help = "Create (or repair) the demo operator, tenants and market, and print the logins."

    def handle(self, *args: Any, **options: Any) -> None:
        logins = demo_accounts_seed()
        market = market_demo_seed()
        self.stdout.write("Demo logins (for local use only):")
        for login in logins:
            self.stdout.write(f"  {login.username:<14} {login.password:<20} {login.role}")
        self.stdout.write(f"Demo market: {market.slug} (model {market.served_model})")
