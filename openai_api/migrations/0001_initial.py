# The batch models (BatchJob, BatchItem) moved here from scheduler_bridge with their tables
# (renamed by scheduler_bridge 0002): this records them in openai_api's state and changes no
# table.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("accounts", "0005_budget_counters"),
        ("scheduler_bridge", "0002_batches_moved_to_openai_api"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="BatchJob",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("public_id", models.CharField(max_length=40, unique=True)),
                        (
                            "submitted_by",
                            models.CharField(
                                blank=True, help_text="Console user, if any.", max_length=150
                            ),
                        ),
                        (
                            "endpoint",
                            models.CharField(
                                blank=True,
                                help_text="The lines' url when they all share one.",
                                max_length=40,
                            ),
                        ),
                        (
                            "model",
                            models.CharField(
                                blank=True, help_text="The lines' model if one.", max_length=200
                            ),
                        ),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("validating", "Validating"),
                                    ("in_progress", "In progress"),
                                    ("completed", "Completed"),
                                    ("failed", "Failed"),
                                    ("cancelling", "Cancelling"),
                                    ("cancelled", "Cancelled"),
                                ],
                                default="validating",
                                max_length=12,
                            ),
                        ),
                        ("input", models.TextField(help_text="The uploaded JSONL, as sent.")),
                        ("metadata", models.JSONField(blank=True, default=dict)),
                        ("total", models.PositiveIntegerField(default=0)),
                        ("completed", models.PositiveIntegerField(default=0)),
                        ("failed", models.PositiveIntegerField(default=0)),
                        ("cancelled", models.PositiveIntegerField(default=0)),
                        (
                            "error",
                            models.TextField(
                                blank=True, help_text="Why the batch failed, if it did."
                            ),
                        ),
                        ("created_at", models.DateTimeField()),
                        ("started_at", models.DateTimeField(blank=True, null=True)),
                        ("cancelled_at", models.DateTimeField(blank=True, null=True)),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "api_key",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="batches",
                                to="accounts.apikey",
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="batches",
                                to="accounts.tenant",
                            ),
                        ),
                    ],
                    options={
                        "ordering": ["-created_at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="BatchItem",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "line",
                            models.PositiveIntegerField(
                                help_text="1-based line number in the input."
                            ),
                        ),
                        ("custom_id", models.CharField(max_length=512)),
                        ("url", models.CharField(max_length=40)),
                        (
                            "body",
                            models.JSONField(
                                help_text="The request body, as the endpoint takes it."
                            ),
                        ),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("pending", "Pending"),
                                    ("running", "Running"),
                                    ("completed", "Completed"),
                                    ("failed", "Failed"),
                                    ("cancelled", "Cancelled"),
                                ],
                                default="pending",
                                max_length=10,
                            ),
                        ),
                        ("attempts", models.PositiveIntegerField(default=0)),
                        (
                            "request_id",
                            models.CharField(
                                blank=True,
                                help_text="The gateway request of the latest attempt.",
                                max_length=200,
                            ),
                        ),
                        ("status_code", models.PositiveSmallIntegerField(blank=True, null=True)),
                        (
                            "response",
                            models.JSONField(
                                blank=True, help_text="The endpoint's answer body.", null=True
                            ),
                        ),
                        (
                            "error",
                            models.JSONField(
                                blank=True, help_text="Why it has no answer, if so.", null=True
                            ),
                        ),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "batch",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="items",
                                to="openai_api.batchjob",
                            ),
                        ),
                    ],
                    options={
                        "ordering": ["batch", "line"],
                    },
                ),
                migrations.AddIndex(
                    model_name="batchjob",
                    index=models.Index(fields=["tenant", "-created_at"], name="batch_tenant_time"),
                ),
                migrations.AddIndex(
                    model_name="batchitem",
                    index=models.Index(fields=["batch", "status"], name="batch_item_status"),
                ),
                migrations.AddConstraint(
                    model_name="batchitem",
                    constraint=models.UniqueConstraint(
                        fields=("batch", "custom_id"), name="batch_item_custom_id"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="batchitem",
                    constraint=models.UniqueConstraint(
                        fields=("batch", "line"), name="batch_item_line"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="batchitem",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("line__gte", 1)), name="batch_item_line_positive"
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
