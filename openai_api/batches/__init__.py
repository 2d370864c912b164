"""Batch jobs (docs/api.md, "Batch jobs"): a JSONL of requests with bids, checked up front,
driven through the gateway's own request flow by a Celery task, their answers kept for download."""
