"""Trace replay: the accepted forms of a line, and a clear error for each bad one."""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import main
from benchmarks.trace import TraceError, load_trace, parse_trace, tokenize
from engines.contract.tokenizer import encode


def _line(**fields: object) -> str:
    base = {"id": "r1", "arrival": 0.5, "tenant": "acme", "max_new_tokens": 4, "bid": 0.2}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None})


def test_the_three_prompt_forms_and_the_time_scale() -> None:
    lines = [
        _line(id="b", arrival=2.0, prompt_tokens=[5, 6, 7]),
        "",
        _line(id="a", arrival=1.0, prompt_tokens=12),
        _line(id="c", arrival=3.0, prompt="Hello, world! Hello", bid=9.0, **{"class": "vip"}),
    ]
    w = parse_trace(lines, time_scale=0.5, seed=1)
    assert [r.id for r in w.requests] == ["a", "b", "c"]  # by arrival
    a, b, c = w.requests
    assert [r.arrival for r in w.requests] == [0.5, 1.0, 1.5]
    assert b.tokens == (5, 6, 7)
    assert len(a.tokens) == 12 and a.tokens == parse_trace(lines, seed=1).requests[0].tokens
    assert c.tokens == tokenize("Hello, world! Hello") == tuple(encode("Hello, world! Hello"))
    assert c.tokens[0] == c.tokens[-1]  # Hello ... Hello
    assert c.bid_class == "vip" and a.tenant == "acme"
    assert (a.max_new_tokens, a.bid) == (4, 0.2)


def test_default_classes_split_the_trace_bids() -> None:
    lines = [_line(id=str(i), bid=float(i), prompt_tokens=[1]) for i in range(10)]
    classes = {r.id: r.bid_class for r in parse_trace(lines).requests}
    assert [k for k, v in classes.items() if v == "high"] == ["8", "9"]


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (_line(id=None, prompt_tokens=[1]), "'id'"),
        (_line(arrival="soon", prompt_tokens=[1]), "'arrival'"),
        (_line(arrival=-1, prompt_tokens=[1]), "'arrival'"),
        (_line(bid=-0.5, prompt_tokens=[1]), "'bid'"),
        (_line(bid=None, prompt_tokens=[1]), "'bid'"),
        (_line(max_new_tokens=0, prompt_tokens=[1]), "'max_new_tokens'"),
        (_line(max_new_tokens=2.5, prompt_tokens=[1]), "'max_new_tokens'"),
        (_line(tenant=3, prompt_tokens=[1]), "'tenant'"),
        (_line(), "exactly one of fields 'prompt_tokens' and 'prompt'"),
        (_line(prompt_tokens=[1], prompt="hi"), "exactly one of"),
        (_line(prompt_tokens=[1, -2]), "'prompt_tokens'"),
        (_line(prompt_tokens=[]), "'prompt_tokens'"),
        (_line(prompt_tokens=0), "'prompt_tokens'"),
        (_line(prompt=""), "'prompt'"),
        (_line(prompt=["hi"]), "'prompt'"),
    ],
)
def test_bad_lines_name_the_line_and_the_field(line: str, field: str) -> None:
    good = _line(id="ok", prompt_tokens=[1, 2])
    with pytest.raises(TraceError) as info:
        parse_trace([good, "", line])
    assert "trace line 3" in str(info.value)
    assert field in str(info.value)


def test_repeated_ids_and_empty_traces() -> None:
    line = _line(prompt_tokens=[1])
    with pytest.raises(TraceError, match="line 2: field 'id' repeats"):
        parse_trace([line, line])
    with pytest.raises(TraceError, match="no requests"):
        parse_trace(["", "  "])


def test_the_cli_reports_a_bad_trace_and_exits_2(tmp_path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_line(prompt_tokens=[1]) + "\n" + _line(id="r2", bid="lots", prompt_tokens=[1]))
    with pytest.raises(TraceError, match="t.jsonl: trace line 2"):
        load_trace(path)
    with pytest.raises(SystemExit) as exit_info:
        main(["--trace", str(path)])
    assert exit_info.value.code == 2
    assert "trace line 2: field 'bid'" in capsys.readouterr().err


def test_the_cli_replays_a_trace(tmp_path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    lines = [
        _line(id=f"r{i}", arrival=i * 0.01, prompt_tokens=[7] * 40 + [i], bid=0.1 * i)
        for i in range(8)
    ]
    path.write_text("\n".join(lines))
    out = tmp_path / "out.json"
    assert main(["--trace", str(path), "--policies", "lpm,dfs-auction", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"lpm", "dfs-auction"}
    assert doc["meta"]["load"] is None
    assert "trace: 8 requests" in capsys.readouterr().out
