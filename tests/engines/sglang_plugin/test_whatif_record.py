"""The SGLang plugin's round records carry the waiting queue with the book, and that queue,
cleared again at the round's reserve, charges the admitted requests what the record says: the
reserve what-if reads the plugin's records as it reads the simulated engine's."""

from __future__ import annotations

import pytest
from sglang.srt.managers.schedule_batch import NextBatchPlan, ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder

from engines.contract.records import round_record_dumps, round_record_loads
from mechanism.whatif import queue_reclear
from tests.engines.sglang_plugin.helpers import market_policy
from tests.engines.sglang_plugin.test_admission import _scenario, admit


@pytest.mark.parametrize(
    "policy", ["dfs-auction", "dfs-auction-density", "dfs-auction-kv-split", "highest-bid"]
)
def test_the_plugins_record_queue_cleared_again_charges_what_the_record_says(policy) -> None:
    charged = 0
    for seed in range(6):
        _, allocator, cache, queue = _scenario(seed + 200, pool=20_000)
        pol, sink = market_policy(policy, cache, book_interval_s=0.0)
        pol.calc_priority(queue)
        adder, _ = admit(PrefillAdder, allocator, cache, queue, rem_input=400)
        pol.finish_round(
            NextBatchPlan(
                batch_to_run=ScheduleBatch(reqs=adder.can_run_list),
                running_batch=ScheduleBatch(reqs=[]),
            )
        )
        (record,) = (round_record_loads(round_record_dumps(r)) for r in sink.records)
        assert len(record["queue"]["id"]) == record["waiting"] == len(queue)
        (outcome,) = queue_reclear(
            record["queue"],
            policy=record["policy"],
            tokens_per_second=record["tokens_per_second"],
            admitted=[a["position"] for a in record["admitted"]],
            reserves=[record["reserve"]],
        )
        assert outcome.charged == tuple((a["request_id"], a["charge"]) for a in record["admitted"])
        charged += sum(c > 0 for _, c in outcome.charged)
    assert charged >= 2
