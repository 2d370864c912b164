"""Migrations: none missing, and all applied on PostgreSQL."""

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


@pytest.mark.django_db
def test_no_model_change_lacks_a_migration() -> None:
    # Exits non-zero (SystemExit) when a model change has no migration.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db
def test_migrations_applied_on_postgres() -> None:
    assert connection.vendor == "postgresql"
    executor = MigrationExecutor(connection)
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []
    tables = set(connection.introspection.table_names())
    assert {"accounts_tenant", "accounts_membership", "auth_user", "django_session"} <= tables
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "accounts_membership")
    assert constraints["membership_unique_per_tenant"]["unique"] is True
    assert constraints["membership_unique_per_tenant"]["columns"] == ["tenant_id", "user_id"]


@pytest.mark.django_db
def test_each_ledger_foreign_key_leads_exactly_one_index() -> None:
    # Every foreign key of the ledger's tables stays indexed (a lookup by it, and PostgreSQL's
    # check when a referenced row is deleted, need one), by exactly one index leading with it:
    # a second one is only written at every insert. The foreign keys' own indexes that a
    # composite index covered were dropped (accounts migration 0013).
    tables = ("accounts_request", "accounts_hold", "accounts_ledgerentry")
    leading: dict[tuple[str, str], list[str]] = {}
    with connection.cursor() as cursor:
        for table in tables:
            found = connection.introspection.get_constraints(cursor, table)
            keys = [info["columns"][0] for info in found.values() if info["foreign_key"]]
            assert keys, table
            for column in keys:
                leading[(table, column)] = sorted(
                    name
                    for name, info in found.items()
                    if (info["index"] or info["unique"]) and info["columns"][0] == column
                )
    assert {key: len(names) for key, names in leading.items()} == dict.fromkeys(leading, 1), leading
    assert leading[("accounts_ledgerentry", "request_id")] == ["ledger_one_per_request_kind"]
    assert leading[("accounts_ledgerentry", "tenant_id")] == ["ledger_tenant_time"]
    assert leading[("accounts_request", "tenant_id")] == ["request_tenant_time"]
    assert leading[("accounts_hold", "tenant_id")] == ["hold_tenant_state"]
