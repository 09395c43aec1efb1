"""Byte-level document matching (LRA "Retrieval", the ACL Anthology Network): the released pairs and a
generated stand-in.

A sample is a pair of documents and a label: 1 if one cites the other (AAN) / if both are about the
same topic (stand-in), else 0. Documents are byte tokens as in :mod:`.byte_text` (byte + 1, padding
0, 257 symbols), each cut to ``max_len`` bytes (LRA: 4,000 per document; SFT and SAMSA give no
length for Retrieval, the CPU configs here use 1,024).

**AAN pairs** (:func:`load_aan`): LRA's released ``new_aan_pairs.{train,eval,test}.tsv`` (the
``lra_release/tsv_data`` folder), one pair per line, tab-separated ``label, id1, id2, text1, text2``
(label ``0``/``1``, possibly written ``0.0``/``1.0``); ``eval`` is the validation split.

**Generated stand-in** (:func:`generate_pairs`, presets in :data:`PRESETS`): "papers" of neutral
filler sentences (the Zipf pseudo-word filler of :mod:`.byte_text`) into which ``mentions`` term words
of the paper's topic are scattered. There are ``topics`` topics of ``terms`` term words each, in
sibling pairs that share half of their terms. Half of the pairs are two papers of one topic
(label 1); a negative pair is a paper and one of its topic's sibling (``hard`` of the negatives:
they share terms) or of any other topic. Deciding needs the term words of both documents, scattered
over about a thousand bytes each, recognised from their bytes and compared across the pair -- a
model that pools per-byte features sees letter frequencies, which terms and filler share. What it
preserves of AAN: byte-level English-like text, ~1k bytes per document, a binary relation carried by
a few content words. What it cannot: real citations (authors, venues, style), pairs whose link is
carried by the meaning of whole passages.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .byte_text import encode_bytes, filler_words, fitting_draft, pseudo_words, zipf_cdf
from .cache import cached_arrays, default_cache_dir

__all__ = ["PairSet", "PairParams", "PRESETS", "SPLITS", "generate_pairs", "load_generated_pairs", "read_aan_tsv",
           "load_aan"]

SPLITS = ("train", "val", "test")
GENERATOR_VERSION = 1
#: LRA's file name of each split (its validation file is ``eval``).
AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}


@dataclass
class PairSet:
    """Document pairs as byte tokens: ``first`` and ``second`` (ragged, each (L_i,) int64 in [1, 256])
    and ``labels`` (S,) int64 0/1."""

    first: list[np.ndarray]
    second: list[np.ndarray]
    labels: np.ndarray

    def __post_init__(self) -> None:
        if not len(self.first) == len(self.second) == len(self.labels):
            raise ValueError(f"pairs: {len(self.first)} first and {len(self.second)} second documents for "
                             f"{len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class PairParams:
    """Stand-in parameters: ``words`` filler pseudo-words (Zipf ``zipf``), ``topics`` (even: sibling
    pairs) of ``terms`` term words (even: half shared with the sibling), ``mentions`` term words per
    paper, ``hard`` fraction of the negatives drawn from the sibling topic, ``length`` (min, max)
    bytes per paper, ``sizes`` pairs per split (train, val, test)."""

    words: int = 2000
    zipf: float = 1.1
    topics: int = 40
    terms: int = 6
    mentions: int = 4
    hard: float = 0.5
    length: tuple[int, int] = (800, 1000)
    sizes: tuple[int, int, int] = (147086, 18090, 17437)

    def __post_init__(self) -> None:
        def whole(name, low, even=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low or (even and v % 2):
                raise ValueError(f"{name}: expected {'an even' if even else 'an'} integer >= {low}, got {v!r}")
        whole("words", 10)
        whole("topics", 2, even=True)
        whole("terms", 2, even=True)
        whole("mentions", 1)
        if not 0 <= self.hard <= 1:
            raise ValueError(f"hard: expected a fraction in [0, 1], got {self.hard!r}")
        lo, hi = (int(x) for x in self.length)
        if lo < 50 or hi < lo + 16 * self.mentions:
            raise ValueError(f"length: expected (min, max) bytes with 50 <= min and room for the mentions "
                             f"(max >= min + 16 * mentions), got {self.length!r}")
        object.__setattr__(self, "length", (lo, hi))
        sizes = tuple(int(s) for s in self.sizes)
        if len(sizes) != 3 or min(sizes) < 1:
            raise ValueError(f"sizes: expected three positive pair counts (train, val, test), got {self.sizes!r}")
        object.__setattr__(self, "sizes", sizes)

    def replace(self, **changes: Any) -> "PairParams":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


#: ``aan``: LRA's AAN split sizes; ``small``: the CPU configs; ``tiny``: tests. Papers are at most
#: ``length[1]`` = 1,000 bytes (tiny: 300), under the configs' ``max_len`` of 1,024.
PRESETS: dict[str, dict[str, Any]] = {
    "aan": {},
    "small": dict(sizes=(4000, 500, 1000)),
    "tiny": dict(words=50, topics=6, terms=4, mentions=3, length=(150, 300), sizes=(48, 16, 16)),
}


def _resolve(p: str | PairParams | Mapping[str, Any]) -> PairParams:
    if isinstance(p, PairParams):
        return p
    if isinstance(p, str):
        if p not in PRESETS:
            raise ValueError(f"preset: unknown retrieval preset {p!r}; valid presets: {sorted(PRESETS)}")
        return PairParams(**PRESETS[p])
    if isinstance(p, Mapping):
        return PairParams(**dict(p))
    raise ValueError(f"params: expected a preset name, PairParams or mapping, got {type(p).__name__}")


def _paper(rng: np.random.Generator, filler: list[str], cdf: np.ndarray, terms: list[str], p: PairParams) -> str:
    """One paper of at most ``p.length[1]`` bytes with ``p.mentions`` of its topic's ``terms``."""
    def draft() -> tuple[str, None]:
        words = filler_words(rng, filler, cdf, int(rng.integers(p.length[0], p.length[1] - 16 * p.mentions + 1)))
        slots = np.sort(rng.choice(np.arange(1, len(words)), size=min(p.mentions, len(words) - 1), replace=False))
        for s in slots[::-1]:
            words.insert(int(s), terms[int(rng.integers(len(terms)))])
        return " ".join(words), None

    return fitting_draft(draft, p.length[1], "paper", f"with {p.mentions} mentions",
                         f"; raise length[1] or lower length[0] or mentions, got length={p.length!r}")[0]


def generate_pairs(params: str | PairParams | Mapping[str, Any], seed: int = 0
                   ) -> dict[str, tuple[list[str], list[str], np.ndarray]]:
    """Stand-in pairs per split: (first texts, second texts, labels) (module doc); the splits come
    from separate seeded streams, the vocabulary and topics from one."""
    p = _resolve(params)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    vocab_rng = np.random.default_rng([int(seed), 4712, 0])
    taken: set[str] = set()
    filler = pseudo_words(vocab_rng, p.words, taken)
    cdf = zipf_cdf(p.words, p.zipf)
    half = p.terms // 2
    topics: list[list[str]] = []
    for _ in range(p.topics // 2):   # sibling topics: one shared half, one own half each
        shared = pseudo_words(vocab_rng, half, taken)
        topics += [shared + pseudo_words(vocab_rng, half, taken), shared + pseudo_words(vocab_rng, half, taken)]
    out = {}
    for i, split in enumerate(SPLITS):
        rng = np.random.default_rng([int(seed), 4712, 1 + i])
        first, second, labels = [], [], []
        for _ in range(p.sizes[i]):
            t = int(rng.integers(p.topics))
            positive = bool(rng.random() < 0.5)
            if positive:
                u = t
            elif rng.random() < p.hard or p.topics == 2:
                u = t ^ 1                                             # the sibling topic
            else:                                                     # any topic but t and its sibling
                u = int(rng.integers(p.topics - 2))
                u += 2 * (u >= (t & ~1))
            first.append(_paper(rng, filler, cdf, topics[t], p))
            second.append(_paper(rng, filler, cdf, topics[u], p))
            labels.append(int(positive))
        out[split] = (first, second, np.array(labels, np.int64))
    return out


def load_generated_pairs(preset: str | PairParams | Mapping[str, Any], split: str, max_len: int | None = None,
                         cache_dir: str | os.PathLike | None = None, seed: int = 0) -> PairSet:
    """A generated split as byte tokens, cached on disk keyed by the parameters and seed."""
    params = _resolve(preset)
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    key = {"generator": "pointformers.retrieval", "version": GENERATOR_VERSION, "params": params.to_dict(),
           "seed": int(seed)}
    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "retrieval"

    def build() -> dict[str, np.ndarray]:
        data = generate_pairs(params, seed)
        return {k: v for s in SPLITS for k, v in ((f"{s}_first", np.array(data[s][0], dtype=np.str_)),
                                                  (f"{s}_second", np.array(data[s][1], dtype=np.str_)),
                                                  (f"{s}_label", data[s][2]))}

    arrays = cached_arrays(root, preset if isinstance(preset, str) else "custom", key, build)
    return PairSet([encode_bytes(str(t), max_len) for t in arrays[f"{split}_first"]],
                   [encode_bytes(str(t), max_len) for t in arrays[f"{split}_second"]],
                   np.asarray(arrays[f"{split}_label"], np.int64))


def read_aan_tsv(path: str | os.PathLike, max_len: int | None = None) -> PairSet:
    """One of LRA's ``new_aan_pairs.*.tsv`` files (module doc). A malformed line -> ValueError naming
    the file and line."""
    path = Path(path)
    first, second, labels = [], [], []
    try:
        f = open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror})") from None
    with f:
        try:
            for no, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                if not line:
                    continue
                cols = line.split("\t")
                if len(cols) != 5:
                    raise ValueError(f"{path}:{no}: expected 5 tab-separated columns (label, id1, id2, text1, "
                                     f"text2), got {len(cols)}")
                try:
                    y = float(cols[0])
                except ValueError:
                    raise ValueError(f"{path}:{no}: label {cols[0]!r} is not a number") from None
                if y not in (0.0, 1.0):
                    raise ValueError(f"{path}:{no}: label must be 0 or 1, got {cols[0]!r}")
                labels.append(int(y))
                first.append(encode_bytes(cols[3], max_len))
                second.append(encode_bytes(cols[4], max_len))
        except UnicodeDecodeError:
            raise ValueError(f"{path}: not UTF-8 text") from None
    if not labels:
        raise ValueError(f"{path}: no pairs")
    empty = [i for i, (a, b) in enumerate(zip(first, second)) if len(a) == 0 or len(b) == 0]
    if empty:
        raise ValueError(f"{path}: pair {empty[0] + 1} has an empty document")
    return PairSet(first, second, np.asarray(labels, np.int64))


def load_aan(root: str | os.PathLike, splits: Sequence[str] = SPLITS, max_len: int | None = None
             ) -> dict[str, PairSet]:
    """LRA's AAN pairs from folder ``root`` (``new_aan_pairs.{train,eval,test}.tsv``)."""
    root = Path(root).expanduser()
    out = {}
    for s in splits:
        if s not in AAN_FILES:
            raise ValueError(f"splits: expected names among {list(SPLITS)}, got {s!r}")
        path = root / AAN_FILES[s]
        if not path.is_file():
            raise ValueError(f"data.root: {path} not found (expected LRA's {', '.join(AAN_FILES.values())})")
        out[s] = read_aan_tsv(path, max_len)
    return out
