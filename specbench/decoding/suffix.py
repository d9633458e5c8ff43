"""SuffixDecoding's speculation (Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging AI
Applications", NeurIPS 2025), as its reference implementation computes it (arctic-inference 0.3.0,
csrc/suffix_decoding/suffix_tree.cc: SuffixTree::speculate, _speculate_path, _speculate_tree).

A suffix tree of depth D over some sequences counts, for every string s of at most D tokens, its occurrences:
count(s) = #{(sequence, i): sequence[i : i + |s|] = s}. The reference stores it path-compressed; `SuffixIndex` reads
the same counts from the sequences themselves (one flat array, sequences separated by -1) in O(N) memory: the
occurrences of s are found by filtering the end positions of its last token. Written here because arctic-inference
installs only with its CUDA kernels.

Speculation from a context c (its last D tokens), as the reference: for match lengths m = 1, 2, .. < |c| while the
last m tokens of c occur, grow from the node s = c[-m:] a draft of at most min(max_spec_tokens,
floor(m * max_spec_factor + max_spec_offset)) tokens, each with probability prob(x) = prob(parent) * count(s + x) /
count(s) (float32, as the reference), none below min_token_prob; the best score (the sum of its tokens'
probabilities) wins, a later, longer match on ties.
- path (a chain): from s, repeatedly the first child in the reference's sibling order (`child_order`);
- tree: best-first by probability with a max-heap, the reference's std::priority_queue (libstdc++'s push_heap and
  pop_heap replayed in `Heap`, so ties pop in its order); a node's children are pushed in sibling order until one
  falls below min_token_prob.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

SEP = -1  # between sequences: never a token, so no occurrence spans two sequences


@dataclass
class Draft:
    """A speculation: tokens [n] in topological order, parents [n] (-1: the context's last token), probs [n]."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


def child_order(tokens: np.ndarray) -> list[int]:
    """The reference's sibling list of a node's children after the increments `tokens` (each occurrence's child
    token, in append order): a new child joins at the tail; a child whose count goes c -> c + 1 stays unless the
    sibling before it has count c or c + 1, then moves before the first sibling of that run."""
    order: list[int] = []
    count: dict[int, int] = {}
    for x in tokens.tolist():
        if x not in count:
            count[x] = 1
            order.append(x)
            continue
        c, i = count[x], order.index(x)
        count[x] = c + 1
        if i == 0 or count[order[i - 1]] > c + 1:
            continue
        j, run = i - 1, count[order[i - 1]]
        while j > 0 and count[order[j - 1]] == run:
            j -= 1
        order.pop(i)
        order.insert(j, x)
    return order


class Heap:
    """std::priority_queue<HeapItem, vector, prob less> as libstdc++ runs it: push = push_back + push_heap, pop =
    pop_heap + pop_back, so items of equal probability come out in the reference's order."""

    def __init__(self) -> None:
        self.v: list[tuple] = []

    def __len__(self) -> int:
        return len(self.v)

    def _up(self, hole: int, top: int, value: tuple) -> None:
        v, parent = self.v, (hole - 1) // 2
        while hole > top and v[parent][0] < value[0]:
            v[hole] = v[parent]
            hole, parent = parent, (parent - 1) // 2
        v[hole] = value

    def push(self, item: tuple) -> None:
        self.v.append(item)
        self._up(len(self.v) - 1, 0, item)

    def pop(self) -> tuple:
        v = self.v
        top = v[0]
        n = len(v) - 1  # the heap after the pop: v[:n]
        if n > 0:
            value = v[n]
            v[n] = top
            hole, child = 0, 0
            while child < (n - 1) // 2:  # __adjust_heap: move the hole down to a leaf, the larger child up
                child = 2 * (child + 1)
                if v[child][0] < v[child - 1][0]:
                    child -= 1
                v[hole] = v[child]
                hole = child
            if n % 2 == 0 and child == (n - 2) // 2:
                child = 2 * (child + 1)
                v[hole] = v[child - 1]
                hole = child - 1
            self._up(hole, 0, value)
        v.pop()
        return top


class SuffixIndex:
    """Token sequences appended over time, read as a suffix tree of depth `depth` (module docstring)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.data: list[int] = []
        self.starts: list[int] = []  # where each sequence begins in data
        self._array: np.ndarray | None = None

    @property
    def array(self) -> np.ndarray:
        if self._array is None or len(self._array) != len(self.data):
            self._array = np.asarray(self.data, dtype=np.int64)
        return self._array

    def new_sequence(self, tokens: Sequence[int] = ()) -> None:
        """Start a sequence (after the last one), with its first tokens."""
        if self.data:
            self.data.append(SEP)
        self.starts.append(len(self.data))
        self.data.extend(int(t) for t in tokens)

    def extend(self, tokens: list[int]) -> None:
        """Append tokens to the last sequence."""
        if not self.starts:
            self.new_sequence()
        self.data.extend(int(t) for t in tokens)

    def truncate(self, sequences: int) -> None:
        """Keep the first `sequences` sequences."""
        if sequences < len(self.starts):
            self.data = self.data[: max(0, self.starts[sequences] - 1)] if sequences else []
            self.starts = self.starts[:sequences]
            self._array = None  # regrowing to the same length must not reuse the old array

    def children(self, ends: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(occurrence ends that continue, the token after each) of the string of `length` tokens ending at `ends`;
        none past the tree's depth."""
        a = self.array
        if length + 1 > self.depth:
            return ends[:0], ends[:0]
        nxt = ends + 1
        cont = ends[(nxt < len(a))]
        cont = cont[a[cont + 1] != SEP]
        return cont, a[cont + 1]

    def head_child(self, ends: np.ndarray, length: int) -> tuple[int, int, np.ndarray] | None:
        """(token, count, its occurrence ends) of the first child in sibling order, None without children."""
        cont, nxt = self.children(ends, length)
        if not len(cont):
            return None
        values, counts = np.unique(nxt, return_counts=True)
        top = counts.max()
        best = values[counts == top]
        x = int(best[0]) if len(best) == 1 else child_order(nxt)[0]  # ties: the reference's list order
        return x, int(top) if len(best) == 1 else int(counts[values == x][0]), cont[nxt == x] + 1

    def ordered_children(self, ends: np.ndarray, length: int) -> list[tuple[int, int, np.ndarray]]:
        """Every child (token, count, its occurrence ends) in sibling order."""
        cont, nxt = self.children(ends, length)
        return [(x, int((nxt == x).sum()), cont[nxt == x] + 1) for x in (child_order(nxt) if len(cont) else [])]

    def matches(self, context: list[int]):
        """(m, ends) for m = 1, 2, .. < len(context): the end positions of the occurrences of context[-m:], while
        there are any."""
        a = self.array
        if not len(a) or len(context) < 2:
            return
        ends = np.flatnonzero(a == context[-1])
        for m in range(1, len(context)):
            if m > 1:
                starts = ends - (m - 1)
                ok = starts >= 0
                ends = ends[ok]
                ends = ends[a[starts[ok]] == context[-m]]
            if not len(ends):
                return
            yield m, ends

    def continuation(self, ends: np.ndarray, length: int) -> tuple[int, np.ndarray] | None:
        """(token, its ends) when the string continues inside one of the reference's compressed nodes: every occurrence
        goes on with the same token (no branch, none ends here); None at a node boundary."""
        cont, nxt = self.children(ends, length)
        if len(cont) != len(ends) or not len(cont) or (nxt != nxt[0]).any():
            return None
        return int(nxt[0]), cont + 1

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1, tree: bool = False) -> Draft:
        """The reference's SuffixTree::speculate on `context` (its last `depth` tokens)."""
        context = list(context)[-self.depth :]
        best, min_prob = Draft(), np.float32(min_token_prob)
        for m, ends in self.matches(context):
            size = float(np.float32(np.float32(m) * np.float32(max_spec_factor)) + np.float32(max_spec_offset)) + 1e-6
            cap = max(0, min(max_spec_tokens, int(size)))
            draft = (self.speculate_tree if tree else self.speculate_path)(ends, m, cap, min_prob)
            if draft.score >= best.score:
                best = draft
                best.match_len = m
        return best

    def speculate_path(self, ends: np.ndarray, m: int, cap: int, min_prob: np.float32) -> Draft:
        """The chain of first children from the matched node: prob *= count(child) / count(node)."""
        d, prob, length, score = Draft(), np.float32(1.0), m, np.float32(0.0)
        while len(d.tokens) < cap and prob >= min_prob:
            child = self.head_child(ends, length)
            if child is None:
                break
            x, count, ends_x = child
            prob = np.float32(prob * np.float32(np.float32(count) / np.float32(len(ends))))
            if prob < min_prob:
                break
            d.parents.append(len(d.tokens) - 1)
            d.tokens.append(x)
            d.probs.append(float(prob))
            score = np.float32(score + prob)
            ends, length = ends_x, length + 1
        d.score = float(score)
        return d

    def after(self, prob: np.float32, ends: np.ndarray, length: int, parent: int) -> tuple:
        """The heap item after a string (the matched node, or a node just emitted): its next token when it continues
        inside a compressed node (emitted at the same probability when popped), else the node to expand."""
        nxt = self.continuation(ends, length)
        if nxt is not None:
            return prob, nxt[0], nxt[1], length + 1, parent
        return prob, None, ends, length, parent

    def speculate_tree(self, ends: np.ndarray, m: int, cap: int, min_prob: np.float32) -> Draft:
        """Best-first by probability, as the reference's _speculate_tree: a popped token is emitted and its
        continuation pushed; a popped node boundary pushes its children in sibling order while their probability,
        prob * count(child) / count(node), is at least min_prob."""
        d, score, heap = Draft(), np.float32(0.0), Heap()
        heap.push(self.after(np.float32(1.0), ends, m, -1))
        while len(d.tokens) < cap and len(heap):
            prob, x, ends, length, parent = heap.pop()
            if x is not None:
                d.tokens.append(x)
                d.parents.append(parent)
                d.probs.append(float(prob))
                score = np.float32(score + prob)
                heap.push(self.after(prob, ends, length, len(d.tokens) - 1))
                continue
            for y, count, ends_y in self.ordered_children(ends, length):
                p = np.float32(np.float32(prob * np.float32(count)) / np.float32(len(ends)))
                if p < min_prob:
                    break
                heap.push((p, y, ends_y, length + 1, parent))
        d.score = float(score)
        return d
