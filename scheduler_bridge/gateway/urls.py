"""Routes of the OpenAI-compatible gateway, mounted at the site root by ``config/urls.py``."""

from django.urls import path

from scheduler_bridge.gateway import views

app_name = "gateway"

urlpatterns = [
    path("v1/chat/completions", views.chat_completions, name="chat_completions"),
    path("v1/completions", views.completions, name="completions"),
    path("v1/models", views.models, name="models"),
    path("metrics", views.prometheus, name="metrics"),
]
