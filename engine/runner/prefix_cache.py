"""Prefix caching over the token-granular KV pool: a radix tree of token sequences -> pool rows.

Every path from the root spells a token sequence whose keys and values some earlier sequence
computed; each node holds an edge of tokens and the pool row of each of them (the row of the
token at position ``p`` of the path is the ``p``-th row along it). A later sequence whose context
starts with a cached path *locks* it and points its first slot-table columns at those rows
(:class:`~engine.runner.slot_rows.SlotRows`): it computes only the tokens after the match.

Rules that keep it exact:

- Only rows of committed tokens enter the tree, when a sequence leaves its slot (finished,
  aborted, preempted): the caller passes the tokens its first rows hold, never a draft.
- A locked row is never written: a sequence appends after its cached prefix, and rollback and
  tree steps only touch rows past it.
- ``refs`` counts the locks through a node (a lock holds its whole path, so a node with
  ``refs == 0`` has no locked descendant); only such nodes are evicted, leaves first, least
  recently used first. ``num_evictable`` (their rows) counts as free KV space.

The clock is a counter of operations, not wall time, so that every tensor-parallel rank
replaying the same calls evicts the same rows. Host-only: nothing here touches a device.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class Node:
    """An edge of ``tokens`` after ``start`` tokens of path, their pool ``rows``, the children
    by first token, the locks through it and when it was last used."""

    __slots__ = ("children", "last_use", "parent", "refs", "rows", "start", "tokens")

    def __init__(self, tokens: list[int], rows: list[int], parent: Node | None,
                 start: int) -> None:
        self.tokens = tokens
        self.rows = rows
        self.parent = parent
        self.start = start
        self.children: dict[int, Node] = {}
        self.refs = 0
        self.last_use = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class RadixCache:
    """The tree; rows go in with :meth:`insert`, out with :meth:`evict`. Counters:
    ``num_rows`` (rows the tree holds), ``num_evictable`` (those of unlocked nodes)."""

    def __init__(self) -> None:
        self.root = Node([], [], None, 0)
        self.root.refs = 1  # (never evicted)
        self.num_rows = 0
        self.num_evictable = 0
        self._clock = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _walk(self, tokens: Sequence[int]) -> tuple[Node, int, int]:
        """The deepest node the path of ``tokens`` reaches, how many of its edge's tokens
        matched, and the tokens matched in all."""
        tokens = tokens if isinstance(tokens, list) else list(tokens)
        node, matched = self.root, 0
        while matched < len(tokens):
            child = node.children.get(tokens[matched])
            if child is None:
                return node, len(node.tokens), matched
            edge = child.tokens
            n = min(len(edge), len(tokens) - matched)
            if tokens[matched:matched + n] != edge[:n]:  # (find the first difference)
                i = 1  # (the first token matched: the child's key)
                while i + 64 <= n and tokens[matched + i:matched + i + 64] == edge[i:i + 64]:
                    i += 64
                while tokens[matched + i] == edge[i]:
                    i += 1
                n = i
            matched += n
            if n < len(edge):
                return child, n, matched
            node = child
        return node, len(node.tokens), matched

    def match(self, tokens: Sequence[int]) -> tuple[int, int]:
        """(the longest cached prefix of ``tokens``, how many of its rows are evictable now and
        would be locked by :meth:`lock`); changes nothing."""
        node, _, matched = self._walk(tokens)
        evictable = 0
        while node is not None and node.refs == 0:  # (unlocked nodes: the path's lower part)
            evictable += min(node.end, matched) - node.start
            node = node.parent
        return matched, evictable

    def _split(self, node: Node, n: int) -> Node:
        """Cut ``node``'s edge after ``n`` tokens: a new upper node takes them; ``node`` keeps
        the rest (so a lock held at ``node`` stays valid). Returns the upper node."""
        upper = Node(node.tokens[:n], node.rows[:n], node.parent, node.start)
        upper.refs, upper.last_use = node.refs, node.last_use
        node.parent.children[node.tokens[0]] = upper
        node.tokens, node.rows, node.start, node.parent = node.tokens[n:], node.rows[n:], \
            node.start + n, upper
        upper.children[node.tokens[0]] = node
        return upper

    def lock(self, tokens: Sequence[int]) -> tuple[list[int], Node]:
        """Lock the cached path of ``tokens`` (all of them must be cached): returns its rows
        and the node to :meth:`unlock` (the path's last node, split to end at ``tokens``)."""
        node, used, matched = self._walk(tokens)
        if matched != len(tokens):
            raise ValueError(f"lock: only {matched} of {len(tokens)} tokens are cached")
        if used < len(node.tokens):
            node = self._split(node, used)
        now, rows, up = self._tick(), [], node
        while up is not self.root:
            if up.refs == 0:
                self.num_evictable -= len(up.rows)
            up.refs += 1
            up.last_use = now
            rows[:0] = up.rows
            up = up.parent
        return rows, node

    def unlock(self, node: Node, upto: Node | None = None) -> None:
        """Release a lock from ``node`` up to (not including) ``upto`` (None: the root)."""
        stop = upto or self.root
        while node is not stop:
            node.refs -= 1
            if node.refs == 0:
                self.num_evictable += len(node.rows)
            node = node.parent

    def insert(self, tokens: Sequence[int], rows: Sequence[int]) -> list[int]:
        """Cache ``rows`` (one per token) under the path of ``tokens``; returns the rows the
        tree did not take (a token already cached under another row): the caller frees them.
        A row the tree holds already for its token (a locked prefix) is neither."""
        if len(tokens) != len(rows):
            raise ValueError(f"insert: {len(tokens)} tokens but {len(rows)} rows")
        node, used, matched = self._walk(tokens)
        if used < len(node.tokens):
            node = self._split(node, used)
        now = self._tick()
        up = node
        while up is not self.root:
            up.last_use = now
            up = up.parent
        dropped = [new for new, held in zip(rows[:matched], self._path_rows(node, matched),
                                            strict=True) if new != held]
        if matched < len(tokens):
            leaf = Node(list(tokens[matched:]), list(rows[matched:]), node, matched)
            leaf.last_use = now
            node.children[leaf.tokens[0]] = leaf
            self.num_rows += len(leaf.rows)
            self.num_evictable += len(leaf.rows)
        return dropped

    def _path_rows(self, node: Node, length: int) -> list[int]:
        rows: list[int] = []
        while node is not self.root:
            rows[:0] = node.rows
            node = node.parent
        return rows[:length]

    def evict(self, num_rows: int) -> list[int]:
        """Free at least ``num_rows`` rows (or every evictable one), unlocked leaves first,
        least recently used first; returns the freed rows."""
        heap = [(n.last_use, id(n), n) for n in self._nodes() if n.refs == 0 and not n.children]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_rows:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[node.tokens[0]]
            freed += node.rows
            self.num_rows -= len(node.rows)
            self.num_evictable -= len(node.rows)
            if parent is not self.root and parent.refs == 0 and not parent.children:
                heapq.heappush(heap, (parent.last_use, id(parent), parent))
        return freed

    def _nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
