from django.apps import AppConfig


class ConfigConfig(AppConfig):
    """The project package as an app, so project-wide management commands have a home."""

    name = "config"
    verbose_name = "Project"
