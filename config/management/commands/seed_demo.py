"""``manage.py seed_demo``: the demo operator, tenants and market, and a closed past month of
the tenants' traffic with its invoice (``accounts.services.demo_history``). Running it twice
changes nothing."""

from typing import Any

from django.core.management.base import BaseCommand

from accounts.money import cents_str
from accounts.services import demo_accounts_seed
from accounts.services.demo_history import demo_history_seed
from market.services import market_demo_seed


class Command(BaseCommand):
    help = (
        "Create (or repair) the demo operator, tenants and market, and a past month's invoice "
        "for each tenant; print the logins."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        logins = demo_accounts_seed()
        market = market_demo_seed()
        invoices = demo_history_seed(market=market)
        self.stdout.write("Demo logins (for local use only):")
        for login in logins:
            self.stdout.write(f"  {login.username:<14} {login.password:<20} {login.role}")
        self.stdout.write(f"Demo market: {market.slug} (model {market.served_model})")
        for invoice in invoices:
            due = cents_str(invoice.total_due)
            self.stdout.write(f"Demo invoice: {invoice.number}, {due} due {invoice.due_on}")
