"""The waiting requests' cached lengths, kept up to date from the radix cache's own changes.

SGLang's cache-aware policies match every waiting request against the radix cache in every
round; at 10,000 waiting requests that matching is most of a round. The plugin matches a request
once, when it arrives, and then follows the cache: ``CacheTracker`` wraps the ``insert``,
``_delete_leaf`` and ``reset`` of the one ``RadixCache`` instance the scheduler uses (a thin
wrapper of that object; SGLang's class and every other cache are left alone), notes what each
changed, and ``apply`` brings the request tree up to date at the start of the next round:

- an insert of ``t`` that found its first ``p`` tokens cached already adds ``t[p:]``: only the
  waiting requests that share ``t`` beyond ``p`` (one page at least) gain, each up to its
  common prefix with ``t`` (rounded down to a page), capped where SGLang caps a match
  (``Req._compute_max_prefix_len``);
- an evicted leaf whose parent ends at depth ``d`` takes the cache's paths through it away:
  the waiting requests that share its path past ``d`` (one page) fall back to ``d``, capped;
- a reset empties the cache: every cached length is 0.

The request tree finds those requests by walking down the changed path (``RequestTree.sharing``),
so a change costs the path and the requests whose cached length it changes, not the queue.
Changes are noted when they happen (during admission, decoding, a finished request's insert)
and applied only in the next ``order``, so that a round's Clearing stays valid until its
admitted requests are priced.

Only a plain ``RadixCache`` is followed (paged or not), and only changes and requests in its
default namespace (no ``extra_key`` or ``cache_salt``, no EAGLE bigram keys): ``supported``
says why another cache is not, and the plugin then matches every waiting request every round
as SGLang does; a request in another namespace is matched every round.

``_delete_leaf`` is private to SGLang: wrapping it holds only for the SGLang the plugin pins
(0.5.23), whose shape :data:`PRIVATE_SURFACE` writes down. ``surface_problem`` checks it when
the plugin starts: on a SGLang that renamed or reshaped any of it the tracking is off (and says
why) rather than wrong, and the conformance stage's test fails loudly on such a SGLang.
"""

from __future__ import annotations

import dataclasses
import inspect
from array import array
from typing import Any

from sglang.srt.mem_cache.radix_cache import InsertResult, RadixCache, RadixKey, TreeNode

INSERT, EVICT, RESET = 0, 1, 2

# What the tracker relies on of SGLang's radix cache, as SGLang 0.5.23 has it: the methods it
# wraps (their parameters after self), the insert result's field, the key's and the node's
# attributes. ``_delete_leaf`` is private and may change in any release.
PRIVATE_SURFACE: dict[str, Any] = {
    "methods": {"insert": ("params",), "_delete_leaf": ("node",), "reset": ()},
    "insert_result": ("prefix_len",),
    "key": ("token_ids", "extra_key", "cache_salt", "is_bigram"),
    "node": ("key", "parent"),
}


def surface_problem(
    cache_class: type = RadixCache,
    result_class: type = InsertResult,
    key_class: type = RadixKey,
    node_class: type = TreeNode,
) -> str | None:
    """How SGLang's radix cache differs from :data:`PRIVATE_SURFACE` (None: it does not)."""
    for name, want in PRIVATE_SURFACE["methods"].items():
        method = getattr(cache_class, name, None)
        if not callable(method):
            return f"RadixCache.{name} is gone"
        got = tuple(p for p in inspect.signature(method).parameters if p != "self")
        if got != want:
            return f"RadixCache.{name} takes {got}, not {want}"
    fields = {f.name for f in dataclasses.fields(result_class)}
    if missing := [f for f in PRIVATE_SURFACE["insert_result"] if f not in fields]:
        return f"InsertResult has no {', '.join(missing)}"
    key_params = inspect.signature(key_class.__init__).parameters
    if missing := [a for a in PRIVATE_SURFACE["key"] if a not in key_params]:
        return f"RadixKey has no {', '.join(missing)}"
    node = node_class()
    if missing := [a for a in PRIVATE_SURFACE["node"] if not hasattr(node, a)]:
        return f"TreeNode has no {', '.join(missing)}"
    return None


def supported(cache: Any) -> str | None:
    """Why the plugin cannot follow this cache's changes (None: it can)."""
    if type(cache) is not RadixCache:
        return f"{type(cache).__name__} is not SGLang's plain RadixCache"
    if (problem := surface_problem()) is not None:
        return f"this SGLang's radix cache is not the one the plugin follows ({problem})"
    if getattr(cache, "disable", False):
        return "the radix cache is disabled"
    if getattr(cache, "is_eagle", False):
        return "EAGLE's bigram keys"
    try:
        from sglang.srt.environ import envs

        if envs.SGLANG_RADIX_FORCE_MISS.get():
            return "SGLANG_RADIX_FORCE_MISS is set"
    except (ImportError, AttributeError):
        pass
    return None


def tracked(req: Any) -> bool:
    """Whether a request's match lives in the cache's default namespace, which is followed."""
    return req.extra_key is None and req.cache_salt is None


def leaf_path(cache: RadixCache, node: TreeNode) -> tuple[list[tuple[Any, int]], int]:
    """The path to a leaf up to its first page (the waiting requests that share it lose it when
    it goes) and its parent's depth: the keys, leaf first, as (token ids, length) pairs joined
    only when read (``path_tokens``). The cache replaces a node's key when it splits the node
    and never changes the tokens of one in place."""
    parts = [(node.key.token_ids, cache.page_size)]
    depth = 0
    x = node.parent
    root = cache.root_node
    while x is not root:
        n = len(x.key)
        parts.append((x.key.token_ids, n))
        depth += n
        x = x.parent
    return parts, depth


def path_tokens(parts: list[tuple[Any, int]]) -> array:
    """The tokens of a ``leaf_path``, root first."""
    path = array("q")
    for ids, n in reversed(parts):
        path.extend(ids[:n])
    return path


class CacheTracker:
    """Notes the changes of one RadixCache instance, for ``apply`` to bring cached lengths up to
    date. ``changes`` holds them in the order they happened: (INSERT, tokens, cached before),
    (EVICT, the leaf's path as (token ids, length) pairs from the leaf up, its parent's depth),
    (RESET,)."""

    def __init__(self, cache: RadixCache) -> None:
        self.cache = cache
        self.page = cache.page_size
        self.changes: list[tuple] = []
        self.applied = 0  # changes applied so far (for the tests and the metrics)
        self._wrap(cache)

    def _wrap(self, cache: RadixCache) -> None:
        insert = cache.insert
        delete_leaf = cache._delete_leaf
        reset = cache.reset
        page = self.page
        changes = self.changes

        def tracked_insert(params: Any) -> Any:
            result = insert(params)
            key = params.key
            if key.extra_key is None and key.cache_salt is None and not key.is_bigram:
                length = len(key) // page * page
                if length > result.prefix_len:
                    tokens = array("q", key.token_ids[:length])
                    changes.append((INSERT, tokens, result.prefix_len))
            return result

        def tracked_delete_leaf(node: Any) -> Any:
            key = node.key
            if key.extra_key is None and key.cache_salt is None:
                changes.append((EVICT, *leaf_path(cache, node)))
            return delete_leaf(node)

        def tracked_reset(*args: Any, **kwargs: Any) -> Any:
            result = reset(*args, **kwargs)
            changes.append((RESET,))
            return result

        cache.insert = tracked_insert
        cache._delete_leaf = tracked_delete_leaf
        cache.reset = tracked_reset

    def apply(self, tree: Any, caps: dict[str, int], on_change: Any) -> None:
        """Apply the noted changes to the request tree, in order: each request whose cached
        length changes gets ``tree.update`` and ``on_change(request_id, cached)``. ``caps``:
        each followed request's cap on its match (requests not in it are not followed)."""
        changes = self.changes
        if not changes:
            return
        if not tree.entries:  # nobody waiting: nothing to bring up to date
            self.applied += len(changes)
            changes.clear()
            return
        page = self.page
        for change in changes:
            kind = change[0]
            if kind == RESET:
                for rid in list(caps):
                    if tree.entries[rid].req.cached_len:
                        tree.update(rid, cached_len=0)
                        on_change(rid, 0)
                continue
            tokens, depth = change[1], change[2]
            if kind == EVICT:
                tokens = path_tokens(tokens)
            for entry, common in tree.sharing(tokens, depth + page):
                rid = entry.req.id
                cap = caps.get(rid)
                if cap is None:
                    continue
                old = entry.req.cached_len
                if kind == INSERT:
                    new = min(common // page * page, cap)
                    if new <= old:
                        continue
                else:
                    new = min(depth, cap)
                    if new >= old:
                        continue
                tree.update(rid, cached_len=new)
                on_change(rid, new)
        self.applied += len(changes)
        changes.clear()
