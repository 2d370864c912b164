"""The plugin loads through SGLang's own plugin loader, from the installed entry point.

Each case runs in a fresh Python process (``load_plugins`` runs once per process and its patches
stay), as a scheduler process starts: publish the server args, ``load_plugins()``, then the real
``Scheduler`` methods. A ``Scheduler`` cannot be built without a model on a GPU, so the methods
run with a stand-in ``self`` holding the attributes they read; what they return is SGLang's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = textwrap.dedent(
    """
    import json, logging, types, warnings
    from array import array
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    for name in ("sglang.srt.layers", "sglang.srt.configs", "sglang.srt.utils"):
        logging.getLogger(name).setLevel(logging.ERROR)

    from sglang.srt.runtime_context import get_context, get_parallel, get_schedule
    get_context().override_server_args(schedule_policy="lpm").install()
    get_parallel().override_permanently(tp_rank=0)
    import sglang.srt.managers.schedule_policy as policy_module
    import sglang.srt.managers.scheduler as scheduler_module
    original = policy_module.SchedulePolicy

    from sglang.srt.plugins import load_plugins
    load_plugins()

    from sglang.srt.managers.schedule_batch import NextBatchPlan, Req, ScheduleBatch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sglang.srt.sampling.sampling_params import SamplingParams

    def scenario():
        cache = RadixCache.create_simulated()
        cache.insert(InsertParams(key=RadixKey(array("q", range(1, 41)))))
        scheduler = types.SimpleNamespace(
            schedule_policy=get_schedule().schedule_policy,
            tree_cache=cache,
            enable_hierarchical_cache=False,
            enable_priority_scheduling=False,
            schedule_low_priority_values_first=False,
            prefill_delayer=None,
        )
        scheduler_module.Scheduler.init_schedule_policy(scheduler)

        def req(rid, ids, bid, t):
            params = None if bid is None else {"bid": bid}
            r = Req(rid=rid, origin_input_text="", origin_input_ids=array("q", ids),
                    sampling_params=SamplingParams(max_new_tokens=8, custom_params=params))
            r.time_stats.set_wait_queue_entry_time(t)
            return r

        queue = [req("long_match_bid0.5", list(range(1, 41)) + [0], 0.5, 1.0),
                 req("nomatch_bid1.5", [900, 901], 1.5, 2.0), req("nobid", [902], None, 3.0),
                 req("match10_bid1.5", list(range(1, 11)) + [0], 1.5, 4.0)]
        scheduler.policy.calc_priority(queue)
        adder_class = scheduler_module.Scheduler.get_prefill_adder_class(scheduler)

        # get_new_batch_prefill's real body around the admission SGLang would do on the GPU.
        admitted = ScheduleBatch(reqs=queue[:2])
        scheduler._get_new_batch_prefill_raw = lambda **kw: (admitted, kw["running_batch"])
        plan = scheduler_module.Scheduler.get_new_batch_prefill(scheduler, ScheduleBatch(reqs=[]))
        sink = getattr(scheduler.policy, "sink", None)
        records = list(getattr(sink, "records", []))
        return {
            "policy_class": policy_module.SchedulePolicy.__qualname__,
            "scheduler_binding": scheduler_module.SchedulePolicy.__qualname__,
            "subclass_of_sglang": issubclass(policy_module.SchedulePolicy, original),
            "built": type(scheduler.policy).__qualname__,
            "market": getattr(scheduler.policy, "market", None) is not None,
            "order": [r.rid for r in queue],
            "adder": adder_class.__qualname__,
            "adder_is_prefill_adder": issubclass(adder_class, policy_module.PrefillAdder),
            "plan_batch": [r.rid for r in plan.batch_to_run.reqs],
            "records": records,
        }

    import os
    results = {"first": scenario()}
    if os.environ.pop("MARKET_POLICY", None):  # read when the scheduler builds its policy
        results["unset"] = scenario()
    print("RESULT " + json.dumps(results))
    """
)


def _parse(proc: subprocess.Popen) -> tuple[dict, str]:
    output, _ = proc.communicate(timeout=240)
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, output[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT ")), output


def _start(extra: dict[str, str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARKET_", "SGLANG_PLUGINS"))}
    env.pop("REDIS_URL", None)
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO_ROOT,
        env={**env, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# Started when this module is collected, so that the two processes (each imports SGLang, which
# takes seconds) run while the other tests do.
_PROCESSES = {
    "selected": _start({"MARKET_POLICY": "dfs-auction"}),
    "not selected": _start({"MARKET_POLICY": "dfs-auction", "SGLANG_PLUGINS": "another"}),
}


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[dict, str]]:
    """Each case's results and log."""
    return {name: _parse(proc) for name, proc in _PROCESSES.items()}


def test_sglang_loads_the_plugin_and_runs_the_auction(runs) -> None:
    results, log = runs["selected"]
    result = results["first"]
    assert "inference_market -> engines.sglang_plugin:register" in log
    assert "Applied 1 hook(s) to sglang.srt.managers.schedule_policy.SchedulePolicy" in log
    assert result["policy_class"] == result["scheduler_binding"] == "AuctionSchedulePolicy"
    assert result["subclass_of_sglang"] and result["built"] == "AuctionSchedulePolicy"
    assert result["market"]
    # By hand: the root's blocks are the subtree of tokens 1..10 (two requests, average bid
    # (0.5 + 1.5) / 2 = 1.0), [900, 901] (1.5) and [902] (0); inside the first, match10 (1.5)
    # goes before long_match (0.5).
    assert result["order"] == ["nomatch_bid1.5", "match10_bid1.5", "long_match_bid0.5", "nobid"]
    assert result["adder"] == "AuctionPrefillAdder" and result["adder_is_prefill_adder"]
    assert result["plan_batch"] == result["order"][:2]
    (record,) = result["records"]
    assert [a["request_id"] for a in record["admitted"]] == result["order"][:2]
    assert record["policy"] == "dfs-auction" and record["engine"] == "sglang@127.0.0.1:30000"


SGLANG_LPM = ["long_match_bid0.5", "match10_bid1.5", "nomatch_bid1.5", "nobid"]


def test_without_a_market_policy_sglang_runs_its_own(runs) -> None:
    result = runs["selected"][0]["unset"]
    assert result["built"] == "AuctionSchedulePolicy" and not result["market"]
    # SGLang's lpm (--schedule-policy lpm): longest cached prefix first, then queue order.
    assert result["order"] == SGLANG_LPM
    assert result["adder"] == "PrefillAdder" and result["records"] == []


def test_sglang_plugins_filter_leaves_sglang_alone(runs) -> None:
    results, log = runs["not selected"]
    assert "Skipping plugin inference_market" in log
    for result in results.values():
        assert result["policy_class"] == result["built"] == "SchedulePolicy"
        assert result["order"] == SGLANG_LPM
