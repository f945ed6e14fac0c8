"""The token store of suffix decoding: every request's prompt and output, indexed so that the
continuations of any recent context can be counted.

Suffix decoding (Arctic Inference; arXiv 2411.04975) drafts from a suffix tree of earlier
requests' text and the current request's: find the longest suffix of the context that occurred
before (the *match*, at most ``max_depth`` - 1 tokens), then walk its continuations, each step
taking the most frequent next token. A node's count is how often its string occurred, so the
step's probability estimate is ``count(child) / count(node)``, and a draft path's estimate the
product of its steps.

Here the tree is implicit, to keep memory linear in the text: each sequence is a token list, and
an index maps every ``width``-gram (widths :data:`WIDTHS`) to the places it ended, newest last.
The node of a matched string is the set of its occurrences (at most :data:`MAX_CANDIDATES`
recent ones of the longest indexed gram that matches); its children are the tokens that followed
them; counts are occurrence counts, exactly a suffix tree's counts over those occurrences.
Matches are verified token by token against the stored text (the index keys are hashes).

Requests are *active* while running (their text grows, and other requests draft from it too) and
*cached* once they leave; ``max_cached`` cached requests are kept, the oldest dropped first. A
dropped request's index entries are skipped when met and purged once they are half the index.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

WIDTHS = (2, 8)  # the gram lengths indexed: a long one finds long matches among many
MAX_CANDIDATES = 32  # occurrences of a gram considered per lookup (the most recent)
_POS_BITS = 32  # an index entry: sequence id << _POS_BITS | the position after the gram


class SuffixIndex:
    """Token lists by request, the gram index over them, active and cached requests."""

    def __init__(self, max_depth: int, max_cached: int) -> None:
        self.max_depth = max_depth
        self.max_cached = max_cached
        self._tokens: dict[int, list[int]] = {}  # sequence id -> its tokens
        self._ids: dict[str | int, int] = {}  # request -> its sequence id
        self._cached: OrderedDict[str | int, None] = OrderedDict()  # left, oldest first
        # per width: gram key -> its entries, oldest first (one entry: the int alone)
        self._index: tuple[dict[int, int | list[int]], ...] = tuple({} for _ in WIDTHS)
        self._next_id = 0
        self._live = 0  # index entries of stored sequences
        self._stale = 0  # entries of dropped ones

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self._tokens.values())

    def tokens(self, req_id: str | int) -> list[int] | None:
        sid = self._ids.get(req_id)
        return None if sid is None else self._tokens[sid]

    def extend(self, req_id: str | int, context: Sequence[int]) -> None:
        """Bring an active request's stored text up to ``context`` (its whole prompt and
        output so far; a request met again after it left starts over)."""
        if req_id in self._cached:
            self._drop(req_id)
        sid = self._ids.get(req_id)
        if sid is None:
            sid = self._ids[req_id] = self._next_id
            self._next_id += 1
            self._tokens[sid] = []
        tokens = self._tokens[sid]
        start = len(tokens)
        tokens.extend(context[start:])
        for width, index in zip(WIDTHS, self._index, strict=True):
            for end in range(max(start, width - 1), len(tokens)):
                key = _key(tokens, end + 1, width)
                entry = sid << _POS_BITS | end + 1
                held = index.get(key)
                if held is None:  # (one entry: the int itself; a list from the second on)
                    index[key] = entry
                elif type(held) is int:
                    index[key] = [held, entry]
                else:
                    held.append(entry)
                self._live += 1

    def leave(self, req_id: str | int) -> None:
        """The request stopped running: its text stays, as one of the cached requests."""
        if req_id not in self._ids or req_id in self._cached:
            return
        self._cached[req_id] = None
        while len(self._cached) > self.max_cached:
            self._drop(next(iter(self._cached)))

    def _drop(self, req_id: str | int) -> None:
        del self._cached[req_id]
        tokens = self._tokens.pop(self._ids.pop(req_id))
        count = sum(max(0, len(tokens) - w + 1) for w in WIDTHS)
        self._live -= count
        self._stale += count
        if self._stale > self._live:  # (purge: rebuild the lists without dropped entries)
            for index in self._index:
                for key, held in list(index.items()):
                    kept = [e for e in _entries(held) if e >> _POS_BITS in self._tokens]
                    if not kept:
                        del index[key]
                    else:
                        index[key] = kept[0] if len(kept) == 1 else kept
            self._stale = 0

    def candidates(self, context: Sequence[int]) -> list[tuple[list[int], int, int]]:
        """The recent occurrences of the context's longest indexed gram that has any (other
        than the context's own end): ``(tokens, position after the match, match length)``,
        the match measured against the stored text, at most ``max_depth - 1``."""
        n = len(context)
        for width, index in reversed(list(zip(WIDTHS, self._index, strict=True))):
            if n < width:
                continue
            held = index.get(_key(context, n, width))
            if held is None:
                continue
            found = []
            for entry in _entries(held)[-MAX_CANDIDATES - 1:]:
                tokens = self._tokens.get(entry >> _POS_BITS)
                pos = entry & ((1 << _POS_BITS) - 1)
                if tokens is None or pos >= len(tokens):
                    continue  # (dropped; a text's end, the context's own among them)
                length = self._match_length(tokens, pos, context)
                if length:
                    found.append((tokens, pos, length))
            if found:
                return found[-MAX_CANDIDATES:]
        return []

    def _match_length(self, tokens: list[int], pos: int, context: Sequence[int]) -> int:
        """The longest ``m <= max_depth - 1`` with ``tokens[pos - m:pos] == context[-m:]``
        (binary search: a match of ``m`` implies every shorter one)."""
        lo, hi = 0, min(pos, len(context), self.max_depth - 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tokens[pos - mid:pos] == list(context[len(context) - mid:]):
                lo = mid
            else:
                hi = mid - 1
        return lo


def _key(tokens: Sequence[int], end: int, width: int) -> int:
    """The index key of the gram ``tokens[end - width:end]``: two ids packed exactly (ids below
    2**21), a longer gram hashed. A collision only adds a candidate that the match check then
    measures against the real tokens."""
    if width == 2:
        return tokens[end - 2] << 21 | tokens[end - 1]
    return hash(tuple(tokens[end - width:end]))


def _entries(held: int | list[int]) -> list[int]:
    return [held] if type(held) is int else held


def draft_from(candidates: list[tuple[list[int], int, int]], max_tokens: int, max_depth: int,
               max_spec_factor: float, min_token_prob: float) -> tuple[list[int], float]:
    """The best draft from a lookup's occurrences, and its score (the sum of its tokens' path
    probabilities: the expected number accepted if the estimates are right).

    For each match length ``m`` among them (longest first), the node of the context's last
    ``m`` tokens is the occurrences matching at least ``m``; from it, the most frequent next
    token is drafted while the path's probability stays at least ``min_token_prob``, for at
    most ``min(max_tokens, max_spec_factor * m, max_depth - m)`` tokens (the tree's depth
    bounds match + draft, so a match is also read shortened to leave ``max_tokens`` room).
    The draft of the largest score wins (ties: the longer match)."""
    best: list[int] = []
    best_score = 0.0
    room = max(1, max_depth - max_tokens)
    lengths = {c[2] for c in candidates} | {min(c[2], room) for c in candidates}
    for m in sorted(lengths, reverse=True):
        limit = min(max_tokens, int(max_spec_factor * m), max_depth - m)
        live = [(tokens, pos) for tokens, pos, length in candidates if length >= m]
        draft: list[int] = []
        prob, score = 1.0, 0.0
        while live and len(draft) < limit:
            counts: dict[int, int] = {}
            for tokens, pos in live:
                if pos < len(tokens):
                    counts[tokens[pos]] = counts.get(tokens[pos], 0) + 1
            if not counts:
                break
            token, count = max(counts.items(), key=lambda kv: kv[1])
            prob *= count / len(live)  # (occurrences that end there count in the node)
            if prob < min_token_prob:
                break
            draft.append(token)
            score += prob
            live = [(tokens, pos + 1) for tokens, pos in live
                    if pos < len(tokens) and tokens[pos] == token]
        if score > best_score:
            best, best_score = draft, score
    return best, best_score
