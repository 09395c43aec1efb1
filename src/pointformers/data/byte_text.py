"""Byte-level document classification (LRA "Text", IMDb): the released reviews and a generated stand-in.

Documents are UTF-8 byte sequences; a byte b is token b + 1 (0 is padding), so the vocabulary has
:data:`VOCAB_SIZE` = 257 symbols (LRA's byte-level encoding, 256 symbols plus padding), and a
document is cut to ``max_len`` bytes (SAMSA/SFT: 1,024; the LRA paper: 4,096).

**IMDb** (:func:`load_imdb`): Stanford's released ``aclImdb`` folder, ``{train,test}/{pos,neg}/*.txt``
(label 1 = pos), the data LRA's Text task reads. The validation split is a seeded, per-class
``val_fraction`` of the training reviews (LRA itself validates on the test reviews).

**Generated stand-in** (:func:`generate_reviews`, presets in :data:`PRESETS`): reviews of neutral
filler sentences of pseudo-words in which ``cues`` (an odd number) sentiment words are scattered at
random places; each cue word is positive or negative, and a "not" right before it flips it; the
label is whether the positive cues outnumber the negative ones. Deciding it needs every cue of the
document (they lie hundreds of bytes apart) and each cue's left neighbour, and recognising a word
needs its bytes together -- a model that only pools per-byte features sees letter frequencies, which
the cue words share with the filler. What it preserves of IMDb: byte-level English-like text, ~1k
bytes per document, a binary label carried by scattered sentiment words with local negation. What it
cannot: real language, sarcasm, reviews whose polarity lies in a few decisive sentences.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .cache import cached_arrays, default_cache_dir

__all__ = ["VOCAB_SIZE", "PAD", "SPLITS", "TextSet", "ReviewParams", "PRESETS", "resolve_params", "encode_bytes",
           "generate_reviews", "load_generated_reviews", "load_imdb", "pseudo_words", "zipf_cdf", "filler_words",
           "MAX_DRAFTS", "fitting_draft"]

PAD = 0
VOCAB_SIZE = 257
#: Drafts of one document a generator tries before it calls its ``length`` too short for its cues.
MAX_DRAFTS = 1000
SPLITS = ("train", "val", "test")
GENERATOR_VERSION = 1

_SYL = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
_POSITIVE = ("superb", "wonderful", "brilliant", "delightful", "excellent", "moving", "charming", "gripping")
_NEGATIVE = ("dreadful", "boring", "awful", "clumsy", "tedious", "dull", "painful", "forgettable")


@dataclass
class TextSet:
    """Documents as byte tokens (ragged, each (L_i,) int64 in [1, 256]) and labels (S,) int64."""

    tokens: list[np.ndarray]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)


def encode_bytes(text: str | bytes, max_len: int | None = None) -> np.ndarray:
    """UTF-8 bytes of ``text`` as tokens byte + 1 (L,) int64, cut to ``max_len``."""
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if max_len is not None:
        raw = raw[:max_len]
    return np.frombuffer(raw, np.uint8).astype(np.int64) + 1


@dataclass(frozen=True)
class ReviewParams:
    """Stand-in generator parameters: ``words`` filler pseudo-words (Zipf exponent ``zipf``), ``cues``
    sentiment words per review (odd), ``negation`` probability that a cue is preceded by "not",
    ``length`` (min, max) bytes per review, ``sizes`` reviews per split (train, val, test)."""

    words: int = 2000
    zipf: float = 1.1
    cues: int = 5
    negation: float = 0.3
    length: tuple[int, int] = (800, 1000)
    sizes: tuple[int, int, int] = (25000, 2500, 25000)

    def __post_init__(self) -> None:
        if isinstance(self.words, bool) or not isinstance(self.words, int) or self.words < 10:
            raise ValueError(f"words: expected an integer >= 10, got {self.words!r}")
        if isinstance(self.cues, bool) or not isinstance(self.cues, int) or self.cues < 1 or self.cues % 2 == 0:
            raise ValueError(f"cues: expected an odd integer >= 1 (no ties), got {self.cues!r}")
        if not 0 <= self.negation < 1:
            raise ValueError(f"negation: expected a probability in [0, 1), got {self.negation!r}")
        lo, hi = (int(x) for x in self.length)
        if lo < 50 or hi < lo:
            raise ValueError(f"length: expected (min, max) bytes with 50 <= min <= max, got {self.length!r}")
        object.__setattr__(self, "length", (lo, hi))
        sizes = tuple(int(s) for s in self.sizes)
        if len(sizes) != 3 or min(sizes) < 1:
            raise ValueError(f"sizes: expected three positive review counts (train, val, test), got {self.sizes!r}")
        object.__setattr__(self, "sizes", sizes)

    def replace(self, **changes: Any) -> "ReviewParams":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


#: ``imdb``: IMDb's sizes (25k / 2.5k held out of train / 25k); ``small``: the CPU configs; ``tiny``: tests.
#: Reviews are at most ``length[1]`` = 1,000 bytes (tiny: 260): under the configs' ``max_len`` of 1,024.
PRESETS: dict[str, dict[str, Any]] = {
    "imdb": {},
    "small": dict(sizes=(4000, 500, 1000)),
    "tiny": dict(words=50, length=(120, 260), cues=3, sizes=(48, 16, 16)),
}


def resolve_params(p: str | ReviewParams | Mapping[str, Any]) -> ReviewParams:
    if isinstance(p, ReviewParams):
        return p
    if isinstance(p, str):
        if p not in PRESETS:
            raise ValueError(f"preset: unknown review preset {p!r}; valid presets: {sorted(PRESETS)}")
        return ReviewParams(**PRESETS[p])
    if isinstance(p, Mapping):
        return ReviewParams(**dict(p))
    raise ValueError(f"params: expected a preset name, ReviewParams or mapping, got {type(p).__name__}")


def pseudo_words(rng: np.random.Generator, count: int, exclude: set[str]) -> list[str]:
    """``count`` distinct pseudo-words of 1-3 consonant-vowel syllables, none in ``exclude`` (which
    grows by the words drawn, so successive calls never repeat a word)."""
    words: list[str] = []
    while len(words) < count:
        w = "".join(_SYL[int(i)] for i in rng.integers(len(_SYL), size=int(rng.integers(1, 4))))
        if w not in exclude:
            exclude.add(w)
            words.append(w)
    return words


def zipf_cdf(count: int, exponent: float) -> np.ndarray:
    """The (count - 1,) cumulative probabilities of a Zipf law over ``count`` ranks (for searchsorted)."""
    z = 1.0 / np.arange(1, count + 1) ** exponent
    return np.cumsum(z / z.sum())[:-1]


def filler_words(rng: np.random.Generator, filler: list[str], cdf: np.ndarray, target: int) -> list[str]:
    """Sentences of 6-15 Zipf-drawn ``filler`` words (capitalised first word, full stop) until about
    ``target`` bytes, as a word list."""
    words: list[str] = []
    size = 0
    while size < target:
        n = int(rng.integers(6, 16))
        sent = [filler[int(np.searchsorted(cdf, rng.random(), side="right"))] for _ in range(n)]
        sent[0] = sent[0].capitalize()
        words += sent[:-1] + [sent[-1] + "."]
        size += sum(len(w) + 1 for w in sent)
    return words


def fitting_draft(draft: Callable[[], tuple[str, Any]], max_bytes: int, kind: str, detail: str,
                  hint: str) -> tuple[str, Any]:
    """The first of up to :data:`MAX_DRAFTS` calls of ``draft`` (seeded, so the same draws every time)
    whose text (the first item it returns) is at most ``max_bytes`` UTF-8 bytes long; where none is, a
    ValueError naming ``length`` (``kind`` of document, ``detail`` of its draft, ``hint`` the remedy) instead
    of drawing forever."""
    for _ in range(MAX_DRAFTS):
        out = draft()
        if len(out[0].encode("utf-8")) <= max_bytes:
            return out
    raise ValueError(f"length: no {kind} of at most {max_bytes} bytes {detail} came out of {MAX_DRAFTS} drafts{hint}")


def _review(rng: np.random.Generator, filler: list[str], cdf: np.ndarray, p: ReviewParams) -> tuple[str, int]:
    """One review of at most ``p.length[1]`` bytes (drawn again, seeded, while longer), so a model
    reading ``max_len >= length[1]`` bytes sees every cue."""
    return fitting_draft(lambda: _review_draft(rng, filler, cdf, p), p.length[1], "review", f"with {p.cues} cues",
                         f" (the filler alone aims at {p.length[0]} bytes or more); raise length[1] to about "
                         f"{p.length[0] + 16 * p.cues + 100} or lower length[0] or cues, got length={p.length!r}")


def _review_draft(rng: np.random.Generator, filler: list[str], cdf: np.ndarray, p: ReviewParams) -> tuple[str, int]:
    # the filler aims below the maximum, leaving room for the cues, a "not" each and the last sentence
    target = int(rng.integers(p.length[0], max(p.length[0], p.length[1] - 16 * p.cues - 100) + 1))
    words = filler_words(rng, filler, cdf, target)
    # the cues: distinct word slots spread over the review (not the first word of a sentence start)
    slots = np.sort(rng.choice(np.arange(1, len(words)), size=p.cues, replace=False))
    score = 0
    for s in slots[::-1]:  # from the back, so inserting "not" keeps the earlier slots' indices
        positive = bool(rng.random() < 0.5)
        negated = bool(rng.random() < p.negation)
        cue = (_POSITIVE if positive else _NEGATIVE)[int(rng.integers(len(_POSITIVE)))]
        words.insert(int(s), cue)
        if negated:
            words.insert(int(s), "not")
        score += 1 if positive != negated else -1
    return " ".join(words), int(score > 0)


def generate_reviews(params: str | ReviewParams | Mapping[str, Any], seed: int = 0) -> dict[str, tuple[list[str], np.ndarray]]:
    """Stand-in reviews per split: (texts, labels) (module doc). Splits come from separate seeded streams."""
    p = resolve_params(params)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    vocab_rng = np.random.default_rng([int(seed), 4711, 0])
    filler = pseudo_words(vocab_rng, p.words, set(_POSITIVE + _NEGATIVE + ("not",)))
    cdf = zipf_cdf(p.words, p.zipf)
    out = {}
    for i, split in enumerate(SPLITS):
        rng = np.random.default_rng([int(seed), 4711, 1 + i])
        rows = [_review(rng, filler, cdf, p) for _ in range(p.sizes[i])]
        out[split] = ([t for t, _ in rows], np.array([y for _, y in rows], np.int64))
    return out


def load_generated_reviews(preset: str | ReviewParams | Mapping[str, Any], split: str, max_len: int | None = None,
                           cache_dir: str | os.PathLike | None = None, seed: int = 0) -> TextSet:
    """A generated split as byte tokens, cached on disk keyed by the parameters and seed."""
    params = resolve_params(preset)
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    key = {"generator": "pointformers.byte_text", "version": GENERATOR_VERSION, "params": params.to_dict(),
           "seed": int(seed)}
    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "byte-text"

    def build() -> dict[str, np.ndarray]:
        data = generate_reviews(params, seed)
        return {**{f"{s}_text": np.array(data[s][0], dtype=np.str_) for s in SPLITS},
                **{f"{s}_label": data[s][1] for s in SPLITS}}

    arrays = cached_arrays(root, preset if isinstance(preset, str) else "custom", key, build)
    texts = [str(t) for t in arrays[f"{split}_text"]]
    return TextSet([encode_bytes(t, max_len) for t in texts], np.asarray(arrays[f"{split}_label"], np.int64))


def _read_review(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None


def load_imdb(root: str | os.PathLike, splits: Sequence[str] = SPLITS, max_len: int | None = None,
              val_fraction: float = 0.1, seed: int = 0) -> dict[str, TextSet]:
    """Stanford's ``aclImdb`` folder (module doc): label 1 = ``pos``; val = a seeded per-class
    ``val_fraction`` of ``train`` (files in name order before the draw, so the split is reproducible)."""
    root = Path(root).expanduser()
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction: expected a fraction in (0, 1), got {val_fraction!r}")
    out: dict[str, TextSet] = {}
    cache: dict[str, tuple[list[np.ndarray], np.ndarray]] = {}
    for s in splits:
        if s not in SPLITS:
            raise ValueError(f"splits: expected names among {list(SPLITS)}, got {s!r}")
        folder = "test" if s == "test" else "train"
        if folder not in cache:
            toks, labels = [], []
            for label, name in ((0, "neg"), (1, "pos")):
                d = root / folder / name
                files = sorted(d.glob("*.txt")) if d.is_dir() else []
                if not files:
                    raise ValueError(f"data.root: no reviews in {d} (expected aclImdb/{{train,test}}/{{pos,neg}}/*.txt)")
                toks += [encode_bytes(_read_review(f), max_len) for f in files]
                labels += [label] * len(files)
            cache[folder] = (toks, np.asarray(labels, np.int64))
        toks, labels = cache[folder]
        if folder == "train":
            rng = np.random.default_rng([int(seed), 1, 2])
            val = np.zeros(len(labels), bool)
            for c in (0, 1):
                idx = np.flatnonzero(labels == c)
                val[rng.choice(idx, max(1, int(round(val_fraction * len(idx)))), replace=False)] = True
            keep = val if s == "val" else ~val
            out[s] = TextSet([t for t, k in zip(toks, keep) if k], labels[keep])
        else:
            out[s] = TextSet(list(toks), labels)
    return out
