"""API keys: how a tenant's programs authenticate to the gateway.

A key reads ``im_<prefix>_<secret>``. Only the sha256 of the whole key is stored: keys are
high-entropy random tokens, so a fast hash is enough (no password stretching needed), and the
visible prefix finds the row without a scan.
"""

from django.conf import settings
from django.db import models

from accounts.models.tenants import Tenant


class ApiKey(models.Model):
    """One API key of a tenant. Revoked keys are kept: the ledger refers to them."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64, unique=True, help_text="sha256 hex of the key")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} (im_{self.prefix}_...)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def display(self) -> str:
        """What may be shown of the key: its prefix, never the secret."""
        return f"im_{self.prefix}_..."
