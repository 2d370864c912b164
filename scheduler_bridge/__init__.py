"""The bridge between the market and its engines.

- ``contract`` (Django-free): what both engines implement and the Django side reads: the round
  records' schema and their one writer, the simulated engine's tokenizer;
- ``client`` (Django-free): the one client of an engine's HTTP API;
- ``settlement`` (Django): round records from the engines' Redis stream or JSONL file, taken
  and published to the live consoles (they move no money), and the periodic steps (pacing,
  invoices);
- ``tasks``: their Celery tasks; ``management``: ``manage.py rounds_consume``.
"""
