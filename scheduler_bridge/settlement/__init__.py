"""Settlement of round records (Django): ``stream`` reads the engines' Redis stream as a consumer
group, checking each record and publishing it live (``market.live``);
``periodic`` holds the periodic steps (autobidder pacing, invoices) that Celery beat runs."""
