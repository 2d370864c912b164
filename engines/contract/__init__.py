"""The engine contract, Django-free: both engines (``engines.sim``, ``engines.sglang_plugin``)
write what this package defines, and the Django side reads it.

- ``records``: the round record's schema (``RoundRecord``), its checks and JSON form;
- ``writer``: the one writer of round records (``RoundRecorder``) and the order book they carry;
- ``knobs``: the market's knobs (``MarketKnobs``), embedded by both engines' configs;
- ``wire``: where the bid travels, the auction's ``meta_info`` fields, the control path;
- ``sinks``: where records go (Redis stream, JSONL, memory), one family with one set of counters;
- ``tokenizer``: the simulated engine's tokenizer, which the gateway also counts tokens with.
"""
