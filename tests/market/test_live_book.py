"""The live order book: rows from round records, keyed diffs, versions, throttling."""

from __future__ import annotations

import pytest

from market.live import book
from market.payloads import BookRow
from tests.market.live_helpers import admitted, record, subtree


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, dict]]:
    """What book_publish sends, instead of sending it."""
    messages: list[tuple[str, dict]] = []
    monkeypatch.setattr(
        book, "group_send", lambda group, payload: messages.append((group, payload))
    )
    return messages


def test_rows_copy_only_the_aggregates() -> None:
    rec = record("m", 1, subtrees=[{**subtree("k1", requests=4, bid_sum=1.0), "tenant": "x"}])
    rows = book.book_rows(rec)
    assert rows == {
        "k1": {
            "key": "k1",
            "label": "<|system|> You are",
            "parent": "",  # a record of an engine that says no more: a top-level subtree
            "branch": "<|system|> You are",
            "depth": 1,
            "prefix_tokens": 40,
            "cached_tokens": 30,
            "requests": 4,
            "bid_sum": 1.0,
            "bid_mean": 0.25,
            "credit_sum": 0.0,  # a record that reports no credits: none
            "density": 0.01,
            "rank": 0,
            "position": 0,
            "tenants": {},
        }
    }


def test_a_record_without_a_book_says_nothing_unless_the_queue_drained() -> None:
    assert book.book_rows(record("m", 1, waiting=5, admitted_requests=[admitted("r1")])) is None
    drained = record("m", 2, waiting=2, admitted_requests=[admitted("r1"), admitted("r2")])
    assert book.book_rows(drained) == {}


def row(key: str, requests: int) -> BookRow:
    return book.book_rows(record("m", 1, subtrees=[subtree(key, requests=requests)]))[key]


def test_diff_sends_changed_and_added_rows_and_removed_keys() -> None:
    old = {"a": row("a", 1), "b": row("b", 2), "c": row("c", 3)}
    new = {"a": row("a", 1), "b": row("b", 5), "d": row("d", 1)}
    changed, removed = book.book_diff(old, new)
    assert [r["key"] for r in changed] == ["b", "d"]  # "a" is unchanged: not sent
    assert removed == ["c"]
    assert book.book_apply(old, changed, removed) == new


def test_publish_versions_and_sends_only_differences(sent, unique_slug) -> None:
    first = record(unique_slug, 1, subtrees=[subtree("a"), subtree("b", position=2)])
    assert book.book_publish(record=first, rows=book.book_rows(first), now=100.0) == "sent"
    ((group, diff),) = sent
    assert group == f"market.{unique_slug}"
    assert (diff["kind"], diff["version"], diff["base"]) == ("book.diff", 1, 0)
    assert sorted(r["key"] for r in diff["changed"]) == ["a", "b"] and diff["removed"] == []

    second = record(unique_slug, 2, subtrees=[subtree("a"), subtree("b", position=2, requests=3)])
    # 0.2 s later: throttled (at most two messages a second), nothing sent
    assert book.book_publish(record=second, rows=book.book_rows(second), now=100.2) == "throttled"
    assert book.book_publish(record=second, rows=book.book_rows(second), now=100.5) == "sent"
    diff = sent[-1][1]
    assert (diff["version"], diff["base"]) == (2, 1)
    assert [r["key"] for r in diff["changed"]] == ["b"] and diff["changed"][0]["requests"] == 3

    same = record(unique_slug, 3, subtrees=[subtree("a"), subtree("b", position=2, requests=3)])
    assert book.book_publish(record=same, rows=book.book_rows(same), now=101.5) == "unchanged"
    older = record(unique_slug, 1, subtrees=[subtree("z")])
    assert book.book_publish(record=older, rows=book.book_rows(older), now=102.0) == "stale"
    assert len(sent) == 2

    snapshot = book.book_snapshot(unique_slug)
    assert snapshot["kind"] == "book.snapshot" and snapshot["version"] == 2
    assert [r["key"] for r in snapshot["rows"]] == ["a", "b"]  # in the round's order
    assert snapshot["round_id"] == "sim@test:epoch1:2"


def test_a_restarted_engine_is_not_stale(sent, unique_slug) -> None:
    before = record(unique_slug, 50, subtrees=[subtree("a")])
    book.book_publish(record=before, rows=book.book_rows(before), now=10.0)
    after = {
        **record(unique_slug, 1, subtrees=[subtree("b")]),
        "epoch": "epoch2",
        "round_id": "sim@test:epoch2:1",
    }
    assert book.book_publish(record=after, rows=book.book_rows(after), now=11.0) == "sent"


def test_clearing_an_idle_book(sent, unique_slug) -> None:
    assert not book.book_clear(market=unique_slug, now=1.0)  # nothing published yet
    rec = record(unique_slug, 1, subtrees=[subtree("a"), subtree("b")])
    book.book_publish(record=rec, rows=book.book_rows(rec), now=10.0)
    assert not book.book_clear(market=unique_slug, now=10.1)  # too soon after the last one
    assert book.book_clear(market=unique_slug, now=11.0)
    diff = sent[-1][1]
    assert diff["changed"] == [] and sorted(diff["removed"]) == ["a", "b"]
    assert diff["waiting"] == 0 and diff["version"] == 2
    assert not book.book_clear(market=unique_slug, now=12.0)  # already empty


def test_the_queue_a_new_request_joins_is_the_mean_of_the_replicas(sent, unique_slug) -> None:
    """What the quotes scale waits to (``openai_api.gateway.selectors.quote_waits``): replica 1
    holds 5 waiting, replica 2 holds 3, so a request joins 4 on average; once the queue has
    drained (the book cleared) 0; before any book, nothing is known."""
    assert book.book_queue_len(unique_slug) is None
    one = record(unique_slug, 1, engine="rep-1", waiting=5, subtrees=[subtree("a")])
    two = record(unique_slug, 1, engine="rep-2", waiting=3, subtrees=[subtree("b")])
    book.book_publish(record=one, rows=book.book_rows(one), now=10.0)
    assert book.book_queue_len(unique_slug) == 5.0
    book.book_publish(record=two, rows=book.book_rows(two), now=11.0)
    assert book.book_queue_len(unique_slug) == 4.0
    assert book.book_clear(market=unique_slug, now=12.0)
    assert book.book_queue_len(unique_slug) == 0.0


def test_two_replicas_books_merge_by_subtree_key(sent, unique_slug) -> None:
    """Replica 1 holds subtree s (3 requests, $0.6/s, 100 tokens of work) and a; replica 2 holds
    s too (1 request, $0.4/s, 100 tokens) and b. Merged, by hand: s has 4 requests, $1.0/s,
    mean 0.25, density 1.0 / 200 = 0.005 (not the mean of 0.006 and 0.004), the best rank and
    position of the two, and says which replica holds how many."""
    one = record(unique_slug, 1, engine="rep-1", waiting=5, subtrees=[
        subtree("s", requests=3, bid_sum=0.6, position=2, rank=1), subtree("a", requests=2),
    ])  # fmt: skip
    two = record(unique_slug, 1, engine="rep-2", waiting=3, subtrees=[
        subtree("s", requests=1, bid_sum=0.4, position=0, rank=0), subtree("b", requests=2),
    ])  # fmt: skip
    assert book.book_publish(record=one, rows=book.book_rows(one), now=10.0) == "sent"
    assert book.book_publish(record=two, rows=book.book_rows(two), now=11.0) == "sent"
    snapshot = book.book_snapshot(unique_slug)
    rows = {r["key"]: r for r in snapshot["rows"]}
    assert sorted(rows) == ["a", "b", "s"] and snapshot["waiting"] == 8
    s = rows["s"]
    assert (s["requests"], s["bid_sum"], s["bid_mean"]) == (4, pytest.approx(1.0), 0.25)
    assert s["density"] == pytest.approx(0.005)
    assert (s["rank"], s["position"]) == (0, 0)
    assert s["replicas"] == {"rep-1": 3, "rep-2": 1}
    assert rows["a"]["replicas"] == {"rep-1": 2} and rows["b"]["replicas"] == {"rep-2": 2}
    # The browser's copy, rebuilt from the diffs, is the merged book.
    shown: dict = {}
    for _, diff in sent:
        shown = book.book_apply(shown, diff["changed"], diff["removed"])
    assert shown == {r["key"]: r for r in snapshot["rows"]}


def test_the_book_names_each_replicas_latest_round_never_one_going_back(sent, unique_slug) -> None:
    """Replicas report in turn (the issue saw the book's round go 152, then 117): the book says
    each one's latest round, and a replica's newer round moves only its own."""
    one = record(unique_slug, 152, engine="rep-1", subtrees=[subtree("a")])
    two = record(unique_slug, 117, engine="rep-2", subtrees=[subtree("b")])
    book.book_publish(record=one, rows=book.book_rows(one), now=10.0)
    assert book.book_snapshot(unique_slug)["rounds"] == {"rep-1": 152}
    book.book_publish(record=two, rows=book.book_rows(two), now=11.0)
    assert book.book_snapshot(unique_slug)["rounds"] == {"rep-1": 152, "rep-2": 117}
    assert sent[-1][1]["rounds"] == {"rep-1": 152, "rep-2": 117}  # the diff says it too
    three = record(unique_slug, 118, engine="rep-2", subtrees=[subtree("b", requests=3)])
    book.book_publish(record=three, rows=book.book_rows(three), now=12.0)
    assert book.book_snapshot(unique_slug)["rounds"] == {"rep-1": 152, "rep-2": 118}


def test_credits_are_summed_beside_the_bids_and_the_density_is_of_both(sent, unique_slug) -> None:
    """Replica 1's s: $0.6/s of bids and $1.4/s of credits over 100 tokens (density 0.02);
    replica 2's: $0.4/s and none over 100 (0.004). Merged: bids 1.0, credits 1.4, density of
    both over the 200 tokens, 2.4 / 200 = 0.012; the work is read back from each density as
    (bids + credits) / density, 100 each."""
    one = record(unique_slug, 1, engine="rep-1", subtrees=[
        subtree("s", requests=3, bid_sum=0.6, credit_sum=1.4),
    ])  # fmt: skip
    two = record(unique_slug, 1, engine="rep-2", subtrees=[subtree("s", requests=1, bid_sum=0.4)])
    assert book.book_rows(one)["s"]["credit_sum"] == 1.4
    book.book_publish(record=one, rows=book.book_rows(one), now=10.0)
    book.book_publish(record=two, rows=book.book_rows(two), now=11.0)
    (s,) = book.book_snapshot(unique_slug)["rows"]
    assert (s["bid_sum"], s["credit_sum"]) == (pytest.approx(1.0), pytest.approx(1.4))
    assert s["bid_mean"] == 0.25 and s["density"] == pytest.approx(0.012)


def test_a_replica_that_went_silent_leaves_the_merged_book(sent, unique_slug) -> None:
    one = record(unique_slug, 1, engine="rep-1", subtrees=[subtree("a")])
    two = record(unique_slug, 1, engine="rep-2", subtrees=[subtree("b")])
    book.book_publish(record=one, rows=book.book_rows(one), now=10.0)
    book.book_publish(record=two, rows=book.book_rows(two), now=11.0)
    later = record(unique_slug, 2, engine="rep-2", subtrees=[subtree("b", requests=3)])
    assert book.book_publish(record=later, rows=book.book_rows(later), now=10.0 + 31.0) == "sent"
    assert [r["key"] for r in book.book_snapshot(unique_slug)["rows"]] == ["b"]
    # One engine left: its rows as they are (no per-replica counts to show).
    assert "replicas" not in book.book_snapshot(unique_slug)["rows"][0]
    # A replica's older round is stale for it alone.
    older = record(unique_slug, 1, engine="rep-2", subtrees=[subtree("c")])
    assert book.book_publish(record=older, rows=book.book_rows(older), now=50.0) == "stale"


@pytest.mark.django_db
def test_the_book_keeps_each_replicas_waiting_bids_and_whose_requests_wait(
    sent, unique_slug
) -> None:
    """What the console counts a new reserve against: each replica's last book record's bids
    (a drained queue has none), and per row the requests of each tenant, summed over replicas.
    Tags are tenants' primary keys; a tag that is no tenant's is shown as such."""
    from tests.accounts.factories import tenant_create

    acme = tenant_create("acme")
    one = record(unique_slug, 1, engine="rep-1", waiting=3, subtrees=[
        {**subtree("s", requests=3), "owners": {str(acme.pk): 2, "": 1}},
    ])  # fmt: skip
    one["waiting_bids"] = [0.001, 0.002, 0.05]
    two = record(unique_slug, 1, engine="rep-2", waiting=2, subtrees=[
        {**subtree("s", requests=2), "owners": {str(acme.pk): 1, "999999": 1}},
    ])  # fmt: skip
    two["waiting_bids"] = [0.0, 0.3]
    for rec, now in ((one, 10.0), (two, 11.0)):
        assert book.book_publish(record=rec, rows=book.book_rows(rec), now=now) == "sent"
    (row,) = book.book_snapshot(unique_slug)["rows"]
    assert row["tenants"] == {"acme": 3, "": 1, "tag 999999": 1}
    assert sorted(book.book_bids(unique_slug)) == [([0.0, 0.3], 2), ([0.001, 0.002, 0.05], 3)]
    # rep-2 drains its queue: its part of the book has no bids left.
    drained = record(unique_slug, 2, engine="rep-2", waiting=1, admitted_requests=[admitted("x")])
    assert book.book_publish(record=drained, rows=book.book_rows(drained), now=12.0) == "sent"
    assert sorted(book.book_bids(unique_slug)) == [([], 0), ([0.001, 0.002, 0.05], 3)]
