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
