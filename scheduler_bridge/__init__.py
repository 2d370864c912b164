"""The Celery bridge that takes the engines' round records into the market.

- ``settlement``: round records from the engines' Redis stream, checked and
  published to the live consoles (they move no money: the gateway settles each request);
- ``tasks``: its Celery tasks (``rounds_consume``, ``ping``) and the forwards of the task names
  that moved to their packages; ``management``: ``manage.py rounds_consume``.
"""
