"""Batch jobs: a JSONL of completion requests with bids, driven through the engine by Celery.

A :class:`BatchJob` keeps its whole input in the database (no files); each line is a
:class:`BatchItem`. Each attempt of an item is one gateway request with a deterministic id
(:func:`openai_api.batches.run.item_request_id`), so a task run again after a worker died
knows exactly what the item's earlier attempt did in the ledger.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from accounts.models import ApiKey, Tenant


class BatchStatus(models.TextChoices):
    """OpenAI's batch states (no finalizing or expiry: items finish one by one)."""

    VALIDATING = "validating", "Validating"  # accepted (its input checked), waiting for a worker
    IN_PROGRESS = "in_progress", "In progress"
    COMPLETED = "completed", "Completed"  # every item finished (served or failed)
    FAILED = "failed", "Failed"  # the batch itself could not run (its items say why)
    CANCELLING = "cancelling", "Cancelling"  # cancelled; items already in flight finish
    CANCELLED = "cancelled", "Cancelled"


BATCH_OPEN = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING)


class BatchJob(models.Model):
    """One uploaded batch of a tenant (``api_key`` null: submitted in the console)."""

    public_id = models.CharField(max_length=40, unique=True)  # "batch_<hex>"
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="batches")
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.PROTECT, related_name="batches"
    )
    submitted_by = models.CharField(max_length=150, blank=True, help_text="Console user, if any.")
    endpoint = models.CharField(
        max_length=40, blank=True, help_text="The lines' url when they all share one."
    )
    model = models.CharField(max_length=200, blank=True, help_text="The lines' model if one.")
    status = models.CharField(
        max_length=12, choices=BatchStatus.choices, default=BatchStatus.VALIDATING
    )
    input = models.TextField(help_text="The uploaded JSONL, as sent.")
    metadata = models.JSONField(default=dict, blank=True)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, help_text="Why the batch failed, if it did.")
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="batch_tenant_time")]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.status})"

    @property
    def is_open(self) -> bool:
        """Not finished yet: validating, in progress or cancelling."""
        return self.status in BATCH_OPEN


class ItemStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"  # an attempt is in flight (or its worker died)
    COMPLETED = "completed", "Completed"  # served: ``response`` holds the 200 body
    FAILED = "failed", "Failed"  # refused or not served: ``response`` holds the error body
    CANCELLED = "cancelled", "Cancelled"  # never sent: the batch was cancelled


class BatchItem(models.Model):
    """One line of a batch: its request body and, once finished, the answer it got."""

    batch = models.ForeignKey(BatchJob, on_delete=models.CASCADE, related_name="items")
    line = models.PositiveIntegerField(help_text="1-based line number in the input.")
    custom_id = models.CharField(max_length=512)
    url = models.CharField(max_length=40)  # "/v1/chat/completions" or "/v1/completions"
    body = models.JSONField(help_text="The request body, as the endpoint takes it.")
    status = models.CharField(max_length=10, choices=ItemStatus.choices, default=ItemStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    request_id = models.CharField(
        max_length=200, blank=True, help_text="The gateway request of the latest attempt."
    )
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True, help_text="The endpoint's answer body.")
    error = models.JSONField(null=True, blank=True, help_text="Why it has no answer, if so.")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["batch", "line"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "custom_id"], name="batch_item_custom_id"),
            models.UniqueConstraint(fields=["batch", "line"], name="batch_item_line"),
            models.CheckConstraint(condition=Q(line__gte=1), name="batch_item_line_positive"),
        ]
        indexes = [models.Index(fields=["batch", "status"], name="batch_item_status")]

    def __str__(self) -> str:
        return f"{self.batch.public_id}:{self.custom_id} ({self.status})"
