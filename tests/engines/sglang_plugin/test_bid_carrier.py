"""The bid's carrier and the auction's answer fields, with SGLang's real classes.

- The bid travels as a field, ``sampling_params.custom_params["bid"]`` (the tenant's tag beside
  it, ``["tenant"]``), which SGLang's model gateway keeps and SGLang's tokenizer manager carries
  to the scheduler's ``Req``; the market knows the request by its rid, as the simulated engine
  does.
- The plugin puts the auction's fields of each admitted request (the bid it read, charge,
  round id, position, planned seconds) in ``req.customized_info``; SGLang's own output
  accumulator and tokenizer manager carry them to the answer's ``meta_info``, where the engine
  client reads them as it reads the simulated engine's.

The expected prices come from an independent clearing of the same queue (mechanism).
"""

from __future__ import annotations

import asyncio

import pytest
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.io_struct import unwrap_from_pickle
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.managers.scheduler_components.output_streamer import (
    _GenerationStreamAccumulator,
)
from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from engines.client.answers import meta_parsed
from engines.contract.wire import AUCTION_META_FIELDS
from mechanism import WaitingRequest, clear
from tests.engines.sglang_plugin.helpers import kv_pool, make_req, market_policy
from tests.engines.sglang_plugin.test_control import one_round

TPS, OVERHEAD = 1_000.0, 2
PROMPTS = {"lo": [1, 2, 3, 4], "mid": [5, 6, 7], "hi": [8, 9, 10, 11, 12]}
BIDS = {"lo": 0.2, "mid": 0.45, "hi": 0.6}


def queue_with_bids():
    # The bids as the engine client writes them and SGLang's gateway delivers them.
    return [
        make_req(name, PROMPTS[name], bid=BIDS[name], arrival=1.0 + i)
        for i, name in enumerate(PROMPTS)
    ]


def independent_clearing(policy: str):
    requests = [
        WaitingRequest(name, tuple(PROMPTS[name]), BIDS[name], 1.0 + i, 0)
        for i, name in enumerate(PROMPTS)
    ]
    return clear(requests, policy, tokens_per_second=TPS, overhead_tokens=OVERHEAD)


@pytest.mark.parametrize("policy", ["dfs-auction", "highest-bid"])
def test_the_bid_field_orders_and_prices_the_request(policy: str) -> None:
    allocator, cache = kv_pool(10_000)
    pol, _ = market_policy(policy, cache, tokens_per_second=TPS, overhead_tokens=OVERHEAD)
    queue = queue_with_bids()
    by_name = {req.rid: req for req in queue}
    record = one_round(pol, allocator, cache, queue)
    expected = independent_clearing(policy)
    assert [a["request_id"] for a in record["admitted"]] == list(expected.order)
    for position, name in enumerate(expected.order):
        entry = record["admitted"][position]
        assert entry["bid"] == BIDS[name] and entry["charge"] == pytest.approx(
            expected.charge(name)
        )
        # What the answer will say: the same fields, one value at the first output token.
        assert by_name[name].customized_info == {
            "bid": [BIDS[name]],
            "charge": [entry["charge"]],
            "round_id": [record["round_id"]],
            "position": [position],
            "planned_completion_s": [entry["planned_completion_s"]],
            "time_saved_s": [entry["time_saved_s"]],
            # What the gateway's settlement keeps of the round (the reserve is 0 here).
            "effective_bid": [BIDS[name]],
            "block": [entry["block"]],
            "engine": [record["engine"]],
            # Its place in line: this round is the first to order it, with all three waiting.
            "rank": [position + 1],
            "ahead": [position],
            "queue_len": [3],
        }
    assert expected.charge("hi") > 0  # the test prices something


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"bid": "0.5e"}, "custom_params.bid"),  # a bid mangled on the way: text, not a number
        ({"bid": 0.5, "tenant": "a b"}, "custom_params.tenant"),
    ],
)
def test_a_mangled_field_fails_that_request_with_its_reason(params, field) -> None:
    allocator, cache = kv_pool(1_000)
    pol, _ = market_policy("dfs-auction", cache)
    bad = make_req("x~bid=0.5", [1, 2], arrival=1.0)  # a rid is an id, whatever it holds
    bad.sampling_params.custom_params = params
    good = make_req("y", [3, 4], bid=0.5, arrival=2.0)
    queue = [good, bad]
    pol.calc_priority(queue)
    assert queue == [bad, good]  # failed requests go first, as a one-token prefill
    assert isinstance(bad.to_finish, FINISH_ABORT) and bad.to_finish.status_code == 400
    assert field in bad.to_finish.message and "x~bid=0.5" in bad.to_finish.message
    assert list(pol.market.tree.entries) == ["y"]


def test_the_tenant_tag_is_the_waiting_requests_owner() -> None:
    allocator, cache = kv_pool(1_000)
    pol, _ = market_policy("dfs-auction", cache)
    tagged = make_req("t", [1, 2], bid=0.5, arrival=1.0)
    tagged.sampling_params.custom_params["tenant"] = "acme_2"
    queue = [tagged, make_req("u", [3, 4], bid=0.25, arrival=2.0)]
    pol.calc_priority(queue)
    assert pol.market.tree.get("t").owner == "acme_2" and pol.market.tree.get("u").owner == ""


def _accumulated(req):
    """One output step of SGLang's scheduler-side accumulator for ``req``: its payload."""
    acc = _GenerationStreamAccumulator(
        return_logprob=False,
        return_hidden_states=False,
        return_routed_experts=False,
        return_indexer_topk=False,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        disaggregation_mode=DisaggregationMode.NULL,
        default_stream_interval=1,
        default_force_stream_interval=50,
        get_cached_tokens_details=lambda r: None,
        is_request_level_customized_info_key=lambda key: False,
        current_weight_version=None,
    )
    acc.accept(req=req)
    return acc.to_payload(dp_rank=0, is_idle_batch=False)


def test_sglang_carries_the_fields_to_meta_info_where_the_client_reads_them() -> None:
    allocator, cache = kv_pool(10_000)
    pol, _ = market_policy("dfs-auction", cache, tokens_per_second=TPS, overhead_tokens=OVERHEAD)
    queue = queue_with_bids()
    hi = queue[2]
    record = one_round(pol, allocator, cache, queue)
    (entry,) = [a for a in record["admitted"] if a["request_id"] == "hi"]
    hi.stream = True
    state = ReqState(out_list=[], finished=False, event=asyncio.Event(), obj=None, time_stats=None)
    # The tokenizer manager's meta_info step needs none of its state (an unstarted instance).
    tokenizer_manager = object.__new__(TokenizerManager)
    meta_infos = []
    for token in (42, 43, 44):  # three decode steps, each streamed
        hi.output_ids.append(token)
        payload = _accumulated(hi)
        customized = unwrap_from_pickle(payload.customized_info)
        meta = {"prompt_tokens": 5, "completion_tokens": len(hi.output_ids), "cached_tokens": 0}
        tokenizer_manager.update_request_meta_info(meta, state, customized, 0, None)
        meta_infos.append(meta)
    for meta in meta_infos:  # every chunk has the fields (SGLang's cumulative streaming)
        assert set(AUCTION_META_FIELDS) <= set(meta)
        parsed = meta_parsed({"meta_info": meta})
        assert (parsed.bid, parsed.round_id, parsed.position) == (
            0.6, record["round_id"], entry["position"]
        )  # fmt: skip
        assert parsed.charge == entry["charge"]
    assert meta_infos[-1]["charge"] == [entry["charge"]]  # one value, not one per token
