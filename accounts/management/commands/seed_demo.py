"""``manage.py seed_demo``: the demo operator and tenants. Running it twice changes nothing."""

from typing import Any

from django.core.management.base import BaseCommand

from accounts.services import demo_accounts_seed


class Command(BaseCommand):
    help = "Create (or repair) the demo operator and demo tenants, and print their logins."

    def handle(self, *args: Any, **options: Any) -> None:
        logins = demo_accounts_seed()
        self.stdout.write("Demo logins (for local use only):")
        for login in logins:
            self.stdout.write(f"  {login.username:<14} {login.password:<20} {login.role}")
