"""The Celery app. Its settings are the ``CELERY_*`` names in ``config.settings``.

Workers start with ``celery -A config worker``; with ``REDIS_URL`` unset, tasks run eagerly
in the calling process instead.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # each app's ``tasks`` module
# Tasks that live in an app's subpackage: the batch API's (openai_api.batches.tasks).
app.autodiscover_tasks(["openai_api.batches"])
