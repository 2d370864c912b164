"""``manage.py check_services``: can the project reach its database and Redis?"""

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from config.health import service_statuses


class Command(BaseCommand):
    help = (
        "Try the database and Redis with short timeouts; print one line "
        "per service and exit non-zero, naming the service, when one cannot be used."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        statuses = service_statuses()
        for status in statuses:
            if status.ok:
                self.stdout.write(status.describe())
        failures = [status.describe() for status in statuses if not status.ok]
        if failures:
            raise CommandError("\n".join(failures))
