"""The engine side, Django-free:

- ``contract``: what both engines implement and the Django side reads: the wire (where the bid
  travels, the answer's auction fields, the control path), the round records' schema and their
  one writer, the market's knobs, the sinks, the simulated engine's tokenizer;
- ``client``: the one client of an engine's HTTP API (``/generate``, control, ``/metrics``);
- ``sim``: the simulated engine, SGLang's native HTTP API in front of a modelled scheduler and KV
  cache; the default engine and the benchmarks' instrument;
- ``sglang_plugin``: the auction inside SGLang's own scheduler, loaded by SGLang's plugin
  registry;
- ``router``: SGLang's model gateway (smg) in front of a market's replicas.

The two engines, the client and the router import none of each other; all of them import only
the contract and ``mechanism``.
"""
