"""The tenant-facing API: what tenants' programs call, and the tenant's pages about that use.

- ``gateway``: the OpenAI-compatible ``/v1/chat/completions``, ``/v1/completions`` and
  ``/v1/models`` (admit, hold, forward through ``engines.client``, settle), its own ASGI
  entry for ``/v1/`` and ``/metrics``;
- ``batches``: OpenAI's batch API (``/v1/batches``), a JSONL of requests with bids driven
  through the gateway's request flow by a Celery task (``tasks``), and the console's batch
  uploads and downloads;
- ``dashboard_views``: the tenant dashboard (live spend and latency, recent requests, batches);
- ``models``: the batch jobs and their items.
"""
