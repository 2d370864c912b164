"""The mechanism of docs/mechanism.md, written plainly: a reference to read and to test against.

This is the auction as a specification: the work model, the orders of fcfs, highest-bid and the
DFS auctions, planned welfare and the Myerson and VCG payments (the sections of that page; the
Myerson one both as its integral and as the sum over crossing points that the fast charges
compute), each in a few lines, by brute force. It is slow on purpose (exponential in places)
and meant for queues of a handful of requests; the rest of ``mechanism`` computes the same
things fast, and ``tests/mechanism`` checks that the two agree.

Nothing here shares code with the rest of the package, so that a mistake there is not repeated
here: the trie is uncompressed (one level per token), work is counted by hashing every prefix,
DFS orders are enumerated outright, and payments come from re-clearing the reference auction on a
grid of bids, or from the reference's own keys of its blocks. Bids are floats in dollars per
second, times are seconds, work is tokens.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Req:
    """A waiting request (``mechanism.WaitingRequest`` without its checks), with its age credit
    ($/s, ``age_credit``): what the DFS auctions add to its effective bid in its block's key.
    The credit is not money: a request's charge is for what its bid buys over bidding 0, its
    credit kept (``crossing_charge``)."""

    id: str
    tokens: tuple[int, ...]
    bid: float
    arrival: float
    cached_len: int = 0
    credit: float = 0.0


def cached_prefixes(reqs: list[Req]) -> set[tuple[int, ...]]:
    """Every token prefix that some request reports as cached."""
    out = set()
    for r in reqs:
        for j in range(r.cached_len):
            out.add(r.tokens[: j + 1])
    return out


def completions(reqs: list[Req], order: list[str], overhead: int, tps: float) -> dict[str, float]:
    """Planned completion (seconds) of each request served in ``order``: each uncached prefix
    token is computed once, by the first request in the order that needs it."""
    by_id = {r.id: r for r in reqs}
    done = cached_prefixes(reqs)
    work = 0
    out = {}
    for rid in order:
        toks = by_id[rid].tokens
        for j in range(len(toks)):
            p = toks[: j + 1]
            if p not in done:
                done.add(p)
                work += 1
        work += overhead
        out[rid] = work / tps
    return out


def eff(bid: float, reserve: float) -> float:
    """The effective bid: a bid under the reserve counts as 0 (docs/mechanism.md, "Payments")."""
    return bid if bid >= reserve else 0.0


def welfare(reqs: list[Req], comp: dict[str, float], reserve: float) -> float:
    """Planned welfare (docs/mechanism.md, "Welfare"): -sum(effective bid x planned completion),
    dollars."""
    return -sum(eff(r.bid, reserve) * comp[r.id] for r in reqs)


# ---- the uncompressed trie, as nested blocks ------------------------------------------------


def blocks_at(reqs: list[Req], depth: int) -> list[list[Req] | Req]:
    """The blocks below a point of depth ``depth`` shared by ``reqs``: requests ending there are
    blocks of their own; the others group by their next token, each group continuing as one
    subtree (a chain of single-token levels until it branches)."""
    ending = [r for r in reqs if len(r.tokens) == depth]
    groups: dict[int, list[Req]] = {}
    for r in reqs:
        if len(r.tokens) > depth:
            groups.setdefault(r.tokens[depth], []).append(r)
    return list(ending) + list(groups.values())


def all_dfs_orders(reqs: list[Req], depth: int = 0) -> Iterator[list[str]]:
    """Every order that serves each subtree contiguously."""
    if len(reqs) == 1 and len(reqs[0].tokens) == depth:
        yield [reqs[0].id]
        return
    blocks = blocks_at(reqs, depth)
    if len(blocks) == 1 and isinstance(blocks[0], list):
        yield from all_dfs_orders(blocks[0], depth + 1)
        return
    sub = []
    for b in blocks:
        if isinstance(b, Req):
            sub.append([[b.id]])
        else:
            sub.append(list(all_dfs_orders(b, depth + 1)))
    for perm in itertools.permutations(range(len(blocks))):
        for choice in itertools.product(*(sub[k] for k in perm)):
            yield [rid for part in choice for rid in part]


def is_dfs_order(reqs: list[Req], order: list[str], split: bool = False) -> bool:
    """True if every set of requests sharing a prefix point is contiguous in ``order``.

    ``split`` (dfs-auction-kv-split): except a set of several requests whose tokens are all
    cached down to the end of their longest common prefix (keeping it together saves nothing).
    """
    pos = {rid: i for i, rid in enumerate(order)}
    done = cached_prefixes(reqs)
    seen = set()
    for r in reqs:
        for d in range(1, len(r.tokens) + 1):
            p = r.tokens[:d]
            if p in seen:
                continue
            seen.add(p)
            sharing = [s for s in reqs if s.tokens[:d] == p]
            if split and len(sharing) > 1:
                common = min(len(s.tokens) for s in sharing)
                for k in range(d, common):
                    if any(s.tokens[k] != sharing[0].tokens[k] for s in sharing):
                        common = k
                        break
                if sharing[0].tokens[:common] in done:
                    continue
            members = [pos[s.id] for s in sharing]
            if max(members) - min(members) + 1 != len(members):
                return False
    return True


def _block_work(
    block: list[Req] | Req, depth: int, done: set[tuple[int, ...]], overhead: int
) -> int:
    """Uncached tokens (below ``depth``) plus overheads of a block."""
    reqs = block if isinstance(block, list) else [block]
    prefixes = set()
    for r in reqs:
        for j in range(depth, len(r.tokens)):
            prefixes.add(r.tokens[: j + 1])
    return len(prefixes - done) + overhead * len(reqs)


# dfs-auction-kv: a block whose first token is already cached counts its work divided by this.
KV_CACHED_BOOST = 4.0

# The DFS auctions' settings: (size is work rather than requests, boost, split).
DFS_SETTINGS = {
    "dfs-auction": (False, 1.0, False),
    "dfs-auction-density": (True, 1.0, False),
    "dfs-auction-kv": (True, KV_CACHED_BOOST, False),
    "dfs-auction-kv-split": (True, KV_CACHED_BOOST, True),
}


@dataclass(frozen=True)
class Keyed:
    """A block at a branch point, as a DFS auction keys it: its requests (a request ending at
    the branch point, or the list of those under one next token), the depth its tokens start
    at, its effective bid sum ($/s), work (tokens), size (what the key divides the bid sum by),
    key and tie."""

    block: list[Req] | Req
    depth: int
    bsum: float
    work: int
    size: float
    key: float
    tie: tuple[float, str]

    def ids(self) -> set[str]:
        """The ids of its requests."""
        return {self.block.id} if isinstance(self.block, Req) else {r.id for r in self.block}


def keyed_blocks(
    group: list[Req],
    depth: int,
    done: set[tuple[int, ...]],
    density: bool,
    reserve: float,
    overhead: int,
    boost: float = 1.0,
    split: bool = False,
) -> list[Keyed]:
    """The blocks at the branch point that ``group`` shares down to ``depth``, in the DFS
    auction's order: key descending, then tie. ``done``: the cached prefixes. ``boost``: a
    subtree whose first token is cached (not a request ending at the branch point) has its size
    (work, or number of requests) divided by it. ``split`` (dfs-auction-kv-split): a subtree of
    several requests whose tokens are all cached down to where it next branches is no block:
    its blocks there stand in its place, each with its size divided by ``boost``."""

    def branch_depth(sub: list[Req], depth: int) -> int:
        """Where a subtree that starts with token ``depth`` next branches or loses a request."""
        end = depth + 1
        while True:
            below = blocks_at(sub, end)
            if len(below) == 1 and isinstance(below[0], list):
                end += 1
            else:
                return end

    def parts(sub: list[Req], depth: int, under: bool) -> list[tuple[list[Req] | Req, int, bool]]:
        """The blocks at a branch point, each with its depth and whether it sits right under a
        split subtree's cached prefix."""
        out = []
        for b in blocks_at(sub, depth):
            if split and isinstance(b, list) and len(b) > 1:
                end = branch_depth(b, depth)
                if b[0].tokens[:end] in done:
                    out.extend(parts(b, end, True))
                    continue
            out.append((b, depth, under))
        return out

    keyed = []
    for b, at, under in parts(group, depth, False):
        members = b if isinstance(b, list) else [b]
        bsum = sum(eff(r.bid, reserve) + r.credit for r in members)
        work = _block_work(b, at, done, overhead)
        size: float = work if density else len(members)
        if under or (isinstance(b, list) and b[0].tokens[: at + 1] in done):
            size = size / boost
        key = bsum / size if size > 0 else math.inf
        tie = min((r.arrival, r.id) for r in members)
        keyed.append(Keyed(b, at, bsum, work, size, key, tie))
    keyed.sort(key=lambda k: (-k.key, k.tie))
    return keyed


def dfs_auction_order(
    reqs: list[Req],
    density: bool,
    reserve: float,
    overhead: int,
    boost: float = 1.0,
    split: bool = False,
) -> list[str]:
    """The DFS auctions, by plain recursion over the uncompressed trie (``keyed_blocks``)."""
    done = cached_prefixes(reqs)

    def rec(group: list[Req], depth: int) -> list[str]:
        if len(group) == 1 and len(group[0].tokens) == depth:
            return [group[0].id]
        out = []
        for k in keyed_blocks(group, depth, done, density, reserve, overhead, boost, split):
            out.extend([k.block.id] if isinstance(k.block, Req) else rec(k.block, k.depth + 1))
        return out

    return rec(list(reqs), 0)


def highest_bid_order(reqs: list[Req], reserve: float) -> list[str]:
    """highest-bid: effective bid descending, then arrival, then id."""
    return [r.id for r in sorted(reqs, key=lambda r: (-eff(r.bid, reserve), r.arrival, r.id))]


def fcfs_order(reqs: list[Req]) -> list[str]:
    """fcfs: arrival, then id."""
    return [r.id for r in sorted(reqs, key=lambda r: (r.arrival, r.id))]


def reference_order(reqs: list[Req], policy: str, reserve: float, overhead: int) -> list[str]:
    """The order of ``policy``, for the policies written out here (not lpm nor dfs-weight)."""
    if policy in DFS_SETTINGS:
        density, boost, split = DFS_SETTINGS[policy]
        return dfs_auction_order(reqs, density, reserve, overhead, boost, split)
    if policy == "highest-bid":
        return highest_bid_order(reqs, reserve)
    if policy == "fcfs":
        return fcfs_order(reqs)
    raise ValueError(policy)


def with_bid(reqs: list[Req], rid: str, bid: float) -> list[Req]:
    """The same queue with request ``rid`` bidding ``bid``, the others unchanged."""
    return [replace(r, bid=bid) if r.id == rid else r for r in reqs]


def myerson_bounds(
    reqs: list[Req],
    rid: str,
    policy: str,
    reserve: float,
    overhead: int,
    tps: float,
    steps: int = 400,
) -> tuple[float, float, float]:
    """Bounds on the Myerson payment of ``rid`` from re-clearing at ``steps`` grid bids.

    T(z) = C(0) - C(z) is non-decreasing, so left and right Riemann sums bracket its integral.
    Returns (low, high, T(b)).
    """
    bid = next(r.bid for r in reqs if r.id == rid)

    def comp_at(z: float) -> float:
        rs = with_bid(reqs, rid, z)
        return completions(rs, reference_order(rs, policy, reserve, overhead), overhead, tps)[rid]

    c0 = comp_at(0.0)
    t_b = c0 - comp_at(bid)
    if bid < reserve or bid == 0:
        return 0.0, 0.0, t_b
    lo_z = reserve
    grid = [lo_z + (bid - lo_z) * k / steps for k in range(steps + 1)]
    ts = [c0 - comp_at(z) for z in grid]
    h = (bid - lo_z) / steps
    left = sum(ts[:-1]) * h
    right = sum(ts[1:]) * h
    return bid * t_b - right, bid * t_b - left, t_b


def crossing_charge(
    reqs: list[Req], rid: str, policy: str, reserve: float, overhead: int, tps: float
) -> tuple[float, float]:
    """The Myerson payment of ``rid`` as a sum over crossing points (payments.py states it in
    prose): by bidding b instead of 0, ``rid`` passes blocks; each passed block contributes the
    seconds its work takes x max(its critical bid, reserve), the critical bid being the lowest
    bid at which ``rid`` would go ahead of it. Returns (charge in dollars, T(b) in seconds).

    DFS auctions: at each branch point on ``rid``'s path, its block, with the effective bids S of
    the others in it and size D, has the key (S + z) / D at bid z, so it goes ahead of a sibling
    of key k at z = k D - S; passing a sibling delays ``rid`` by exactly the sibling's work.
    highest-bid: ``rid`` passes the requests between its place and where it would stand at bid
    0, each at its effective bid; placed right after request m it would complete when m
    completes now (the same work is done by then), so passing m saves what m's completion adds
    to the one before it.
    """
    me = next(r for r in reqs if r.id == rid)
    bid = eff(me.bid, reserve)
    if bid <= 0:
        return 0.0, 0.0
    if policy == "highest-bid":
        order = highest_bid_order(reqs, reserve)
        at0 = highest_bid_order(with_bid(reqs, rid, 0.0), reserve)
        comp = completions(reqs, order, overhead, tps)
        bids = {r.id: eff(r.bid, reserve) for r in reqs}
        charge = saved = 0.0
        for prev, m in itertools.pairwise(order[order.index(rid) :]):
            if at0.index(m) < at0.index(rid):  # passed
                charge += max(bids[m], reserve) * (comp[m] - comp[prev])
                saved += comp[m] - comp[prev]
        return charge, saved
    if policy not in DFS_SETTINGS:
        raise ValueError(policy)
    density, boost, split = DFS_SETTINGS[policy]
    done = cached_prefixes(reqs)
    charge = saved = 0.0
    group, depth = list(reqs), 0
    while not (len(group) == 1 and len(group[0].tokens) == depth):
        blocks = keyed_blocks(group, depth, done, density, reserve, overhead, boost, split)
        mine = next(k for k in blocks if rid in k.ids())
        members = mine.block if isinstance(mine.block, list) else [mine.block]
        # Summed afresh, not mine.bsum - bid: that can round across a tie. The request's own
        # credit counts with the others' bids: it is in its key whatever it bids.
        others = sum(eff(r.bid, reserve) for r in members if r.id != rid)
        others += sum(r.credit for r in members)

        def ahead(z: float, k: Keyed, mine: Keyed = mine, others: float = others) -> bool:
            """``rid``'s block goes ahead of ``k`` when ``rid`` bids ``z``."""
            key = (others + z) / mine.size if mine.size > 0 else math.inf
            return (-key, mine.tie) < (-k.key, k.tie)

        for k in blocks:
            if k is not mine and ahead(bid, k) and not ahead(0.0, k):
                charge += max(k.key * mine.size - others, reserve) * k.work / tps
                saved += k.work / tps
        if isinstance(mine.block, Req):
            break
        group, depth = mine.block, mine.depth + 1
    return charge, saved


def vcg_payment(reqs: list[Req], rid: str, reserve: float, overhead: int, tps: float) -> float:
    """Clarke pivot, normalised so a zero bid pays nothing: the others' loss of welfare."""

    def others_welfare(rs: list[Req]) -> float:
        comp = completions(rs, dfs_auction_order(rs, True, reserve, overhead), overhead, tps)
        return sum(-eff(r.bid, reserve) * comp[r.id] for r in rs if r.id != rid)

    return others_welfare(with_bid(reqs, rid, 0.0)) - others_welfare(reqs)


def tenant_payment(
    reqs: list[Req],
    rid: str,
    owners: dict[str, str],
    policy: str,
    reserve: float,
    overhead: int,
    tps: float,
) -> float:
    """The tenant-level charge of ``rid`` (``charge_scope = "tenant"``), by brute force.

    dfs-auction-density without a reserve, where the standard charge is the VCG one: the delay
    ``rid``'s bid imposes on the *other tenants'* requests, weighted by their bids plus their age
    credits (re-clearing with ``rid`` at 0 and comparing every completion), less ``rid``'s own
    credit x T(bid), within [0, bid x T(bid)]. Otherwise: the
    Myerson payment (the grid's midpoint) less the same delay on its own tenant's other
    requests, within [reserve x T(bid), bid x T(bid)]. ``owners`` maps ids to tenants; "" is a
    tenant of its own.
    """
    me = owners.get(rid, "")
    bid = next(r.bid for r in reqs if r.id == rid)
    if bid < reserve or bid == 0:
        return 0.0
    base = completions(reqs, reference_order(reqs, policy, reserve, overhead), overhead, tps)
    zeroed = with_bid(reqs, rid, 0.0)
    at0 = completions(zeroed, reference_order(zeroed, policy, reserve, overhead), overhead, tps)
    saved = at0[rid] - base[rid]

    def delay_on(same: bool) -> float:
        return sum(
            (eff(r.bid, reserve) + r.credit) * (base[r.id] - at0[r.id])
            for r in reqs
            if r.id != rid and ((owners.get(r.id, "") == me and me != "") == same)
        )

    if reserve == 0 and policy == "dfs-auction-density":
        # Less the value of the time its bid saves it at its own credit: the credit is no bid.
        charge = delay_on(False) - next(r.credit for r in reqs if r.id == rid) * saved
        low = 0.0
    else:
        lo, hi, _ = myerson_bounds(reqs, rid, policy, reserve, overhead, tps, steps=400)
        charge = (lo + hi) / 2 - delay_on(True)
        low = reserve * saved
    return min(max(charge, low), bid * saved)


def age_credit(r: Req, now: float, wait_s: float, density: float, steps: int) -> float:
    """The age credit ($/s) of ``r`` at ``now`` (mechanism.aging states the rule): the steps of
    ``wait_s / steps`` seconds it has waited, at most ``steps``, times ``density`` x its prompt
    tokens / ``steps``."""
    level = sum(1 for m in range(1, steps + 1) if r.arrival + m * wait_s / steps <= now)
    return density * len(r.tokens) * level / steps
