"""The Prometheus alerting rules shipped in deploy/prometheus/alerts.yml: the file parses, each
rule is complete, and every metric its expressions name is one a real gateway's /metrics
exposes once it has served a request (so a renamed metric breaks this test, not the alerts in
production, silently)."""

from __future__ import annotations

import re

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO_ROOT
from tests.openai_api.helpers import HELLO

RULES = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
# PromQL words that are not metric names: operators and modifiers, the special numbers.
KEYWORDS = frozenset(
    "and or unless bool offset by without on ignoring group_left group_right inf nan".split()
)
_DURATION = re.compile(r"(?<![\w:])[0-9]+(?:ms|[smhdwy])(?![\w:])")
_NUMBER = re.compile(r"(?<![\w:])[0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?(?![\w:])", re.IGNORECASE)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once strings, label matchers,
    ranges, groupings, durations, numbers, function names and keywords are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', " ", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = _DURATION.sub(" ", text)  # offset 1m
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        if re.match(r"\s*\(", text[match.end() :]):
            continue  # a function or an aggregation
        if match.group().lower() not in KEYWORDS:
            names.add(match.group())
    return names


def rules() -> list[dict]:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_extractor_finds_metric_names_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (market, le) (rate(a_bucket{market!="-",le="+Inf"}[5m])))'
        " > 5 and on (market) b_total offset 1m > bool 1e3 or sum without (x) (c:recorded)"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c:recorded"}


def test_the_rules_file_parses_and_each_rule_is_complete() -> None:
    found = rules()
    assert [r["alert"] for r in found] == ["MarketQueueLong", "MarketTTFTp99High"]
    for rule in found:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"])
    assert metric_names(found[0]["expr"]) == {"gateway_requests_waiting"}
    assert metric_names(found[1]["expr"]) == {"gateway_engine_ttft_seconds_bucket"}


def test_every_metric_the_rules_read_is_exposed_by_the_gateway(gateway, acme, market, settings):
    settings.METRICS_TOKEN = "alert-rules"
    acme.client(gateway).chat.completions.create(
        model=market.served_model, messages=HELLO, max_tokens=1, extra_body={"bid": "0.01"}
    )
    with acme.http(gateway) as http:
        text = http.get("/metrics", headers={"Authorization": "Bearer alert-rules"}).text
    exposed = {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }
    assert "gateway_requests_total" in exposed  # the exposition was read
    for rule in rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= exposed, (rule["alert"], names - exposed)
