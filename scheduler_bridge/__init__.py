"""Engine client, gateway plumbing, Celery tasks, the SGLang plugin and the simulated engine."""
