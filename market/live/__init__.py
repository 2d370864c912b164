"""Live data for the consoles: what producers send to the websocket groups (``market.payloads``).

- :mod:`market.live.send`: the one way to send a payload to a group, from any thread;
- :mod:`market.live.book`: order-book rows from round records, keyed diffs, the shared last state;
- :mod:`market.live.publisher`: round records (as the consumers take them) to books, round
  results and spend ticks, throttled per market and per tenant;
- :mod:`market.live.engine_status`: scraping an engine's Prometheus ``/metrics``;
- :mod:`market.live.periodic`: the once-a-second work (engine status, spend of token charges).
"""
