"""The auction market inside SGLang 0.5.23: a scheduler plugin (docs/engines.md, "SGLang with the
auction", and the contract it keeps, "The engine contract").

SGLang's plugin loader (``sglang.srt.plugins.load_plugins``, run at the start of every SGLang
process) finds ``register`` through the entry point group ``sglang.srt.plugins`` declared in
pyproject.toml and calls it. ``register`` only registers hooks with SGLang's ``HookRegistry``;
the loader applies them:

- REPLACE ``sglang.srt.managers.schedule_policy.SchedulePolicy`` by ``AuctionSchedulePolicy``,
  which adds ``dfs-auction``, ``dfs-auction-density``, ``dfs-auction-kv``,
  ``dfs-auction-kv-split`` and ``highest-bid``;
- AFTER ``Scheduler.get_new_batch_prefill``: price the admitted requests, emit the round record;
- AFTER ``Scheduler.get_prefill_adder_class``: in-batch deferral for the DFS auctions.

Which policy runs, and where round records go: ``config`` (env ``MARKET_POLICY``, or a JSON file
named by ``MARKET_PLUGIN_CONFIG``). With neither set, SGLang runs exactly as without the plugin.
Install with ``pip install '.[sglang]'`` next to SGLang; a request's bid ($/s of waiting) is
read as the engine contract says (``engines.contract.wire``:
``sampling_params.custom_params["bid"]``, which SGLang's model gateway keeps), and its answer's
``meta_info`` carries the auction's fields through SGLang's ``customized_info``.
"""

from __future__ import annotations

SCHEDULE_POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"
GET_NEW_BATCH_PREFILL = "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill"
GET_PREFILL_ADDER_CLASS = "sglang.srt.managers.scheduler.Scheduler.get_prefill_adder_class"


def register() -> None:
    """Register the plugin's hooks with SGLang's HookRegistry (SGLang's loader applies them)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .policy import (
        AuctionSchedulePolicy,
        after_get_new_batch_prefill,
        after_get_prefill_adder_class,
    )

    HookRegistry.register(SCHEDULE_POLICY, AuctionSchedulePolicy, HookType.REPLACE)
    HookRegistry.register(GET_NEW_BATCH_PREFILL, after_get_new_batch_prefill, HookType.AFTER)
    HookRegistry.register(GET_PREFILL_ADDER_CLASS, after_get_prefill_adder_class, HookType.AFTER)
