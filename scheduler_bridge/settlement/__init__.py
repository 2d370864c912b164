"""Settlement of round records (Django): ``stream`` reads the engines' Redis stream as a consumer
group, ``jsonl`` follows a round-records file (the embedded mode), both settling each record in
the ledger (``accounts.services.settlement``) and publishing it live (``market.live``);
``periodic`` holds the periodic steps (autobidder pacing, invoices) that Celery beat runs."""
