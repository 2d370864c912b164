from django.apps import AppConfig
from django.db.backends.signals import connection_created


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts"

    def ready(self) -> None:
        from accounts.ledger.statements.sql import generic_plans  # noqa: PLC0415

        connection_created.connect(generic_plans, dispatch_uid="accounts.generic_plans")
