"""The engines, Django-free, each implementing the engine contract (``scheduler_bridge.contract``):

- ``sim``: the simulated engine, SGLang's native HTTP API in front of a modelled scheduler and KV
  cache; the embedded default engine and the benchmarks' instrument;
- ``sglang_plugin``: the auction inside SGLang's own scheduler, loaded by SGLang's plugin
  registry.

Neither imports the other; both import only ``market.mechanism`` and the contract.
"""
