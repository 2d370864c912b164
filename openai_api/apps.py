from django.apps import AppConfig


class OpenaiApiConfig(AppConfig):
    name = "openai_api"
    verbose_name = "Tenant API (OpenAI-compatible gateway and batches)"
