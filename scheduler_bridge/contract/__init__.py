"""The engine contract, Django-free: both engines (``engines.sim``, ``engines.sglang_plugin``)
write what this package defines, and the Django side reads it.

- ``records``: the round record's schema (``RoundRecord``), its checks and JSON form;
- ``writer``: the one writer of round records (``RoundRecorder``) and the order book they carry;
- ``tokenizer``: the simulated engine's tokenizer, which the gateway also counts tokens with.
"""
