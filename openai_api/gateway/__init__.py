"""The tenant-facing, OpenAI-compatible gateway (docs/api.md, "A request's path: admit, forward,
settle" and "Errors").

``views`` (HTTP, thin) -> ``validation`` (the body, the bid, the headers: pydantic models, from
which the OpenAPI document is generated) -> ``services`` (admit, forward through
``engines.client``, settle) with ``keys`` (API keys, cached),
``selectors`` (markets), ``chat_templates`` (prompts and their token counts), ``responses``
(OpenAI's shapes plus the ``auction`` object), ``errors`` (OpenAI-style error bodies),
``metrics`` (Prometheus) and ``db`` (the database threads). ``asgi`` serves ``/v1/`` without the
site's middleware (``benchmarks.gateway`` measures the gateway's added latency).
"""
