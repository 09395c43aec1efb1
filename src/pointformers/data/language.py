"""Word-level language-modelling corpora: WikiText's token files and a generated stand-in.

A corpus is a vocabulary (a list of words; id = index) and one int32 token stream per split.
The first three ids are the same everywhere: ``<pad>`` 0 (never in a stream), ``<eos>`` 1 (the end
of every line) and ``<unk>`` 2.

**WikiText** (:func:`load_wikitext`): the released ``wiki.{train,valid,test}.tokens`` files of
WikiText-103 (or WikiText-2, the same format), already tokenised with rare words replaced by
``<unk>``. Every line -- blank ones included -- becomes its whitespace-separated words followed
by ``<eos>``, the convention of fairseq's preprocessing and of PyTorch's word-language-model
example, so perplexities compare with the literature's (FLT's Table 1 reports validation
perplexity on WikiText-103). The vocabulary is every word of the training file, most frequent
first (ties in order of first appearance); ``max_vocab`` keeps only the most frequent words and
maps the rest to ``<unk>`` -- a smaller model, but its perplexity is no longer WikiText's.
Words of the validation and test files missing from the vocabulary become ``<unk>`` too.

**Generated stand-in** (:func:`generate_corpus`, presets in :data:`PRESETS`): WikiText-like
documents -- a heading ``= Name =`` line, then paragraphs of sentences -- built so that predicting
the next word needs context at three ranges:

* *local* (the previous word or two): each sentence follows one of a few templates (subject, verb,
  determiner, adjective, noun, preposition, ...) whose next slot the previous word reveals;
* *document topic* (tens to hundreds of words back): a document has one of ``topics`` topics, and
  most of its nouns and verbs come from that topic's own Zipf-distributed subset of the
  vocabulary, so the earlier nouns tell which subset the next one comes from;
* *copying* (anywhere earlier in the document): each document names 2-4 people drawn from a pool
  of ``names`` rare names (its heading names the first); sentences start with one of them or a
  pronoun, so the right name is the one seen before in this document, not a frequent one.

What it preserves of WikiText: a Zipfian word distribution, the line/heading/paragraph layout and
``<eos>`` convention, topical coherence within an article and recurring rare proper names (the
long-range cue the literature measures). What it cannot: real syntax and meaning, a 267k-word
vocabulary, 103M tokens, discourse structure beyond topic and names. A model without attention
sees only the local cue (``mlp-lm`` adds a causal mean of the earlier words, which recovers the
topic roughly but cannot copy a name); full attention can use all three.
"""
from __future__ import annotations

import os
from array import array
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .cache import cached_arrays, default_cache_dir

__all__ = ["PAD", "EOS", "UNK", "SPECIALS", "SPLITS", "WIKITEXT_FILES", "TextParams", "PRESETS", "Corpus",
           "resolve_params", "generate_corpus", "load_generated_corpus", "read_token_lines", "build_vocabulary",
           "encode_token_file", "load_wikitext", "write_token_file", "lm_windows"]

PAD, EOS, UNK = 0, 1, 2
SPECIALS = ("<pad>", "<eos>", "<unk>")
SPLITS = ("train", "val", "test")
#: The split files of a WikiText folder (WikiText-103 and WikiText-2 name them alike).
WIKITEXT_FILES = {"train": "wiki.train.tokens", "val": "wiki.valid.tokens", "test": "wiki.test.tokens"}

GENERATOR_VERSION = 1

_DETS = ("the", "a", "this", "its")
_PREPS = ("of", "in", "to", "with", "by", "for", "on", "at", "from", "after")
_PRONOUNS = ("he", "she", "they", "it")
_OTHER = (".", ",", "and", "was", "is", "=", "@-@", "that")
_FUNCTION_WORDS = _DETS + _PREPS + _PRONOUNS + _OTHER
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70 syllables


@dataclass(frozen=True)
class TextParams:
    """Generator parameters of the stand-in corpus (module doc).

    topics: number of document topics; nouns, verbs, adjectives, names: word pools;
    topic_nouns, topic_verbs: each topic's own subset sizes (drawn from the pools, may overlap);
    topic_share: probability that a noun/verb comes from the document's topic subset (else from
    the whole pool); zipf: exponent of every word distribution; names_per_doc: (min, max) people
    per document; sentences_per_doc: (min, max); sizes: tokens per split (train, val, test), each
    split made of whole documents until it reaches its size (then cut there).
    """

    topics: int = 24
    nouns: int = 1500
    verbs: int = 300
    adjectives: int = 200
    names: int = 3000
    topic_nouns: int = 120
    topic_verbs: int = 30
    topic_share: float = 0.85
    zipf: float = 1.1
    names_per_doc: tuple[int, int] = (2, 4)
    sentences_per_doc: tuple[int, int] = (10, 40)
    sizes: tuple[int, int, int] = (1_000_000, 100_000, 100_000)

    def __post_init__(self) -> None:
        for name in ("topics", "nouns", "verbs", "adjectives", "names", "topic_nouns", "topic_verbs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        if self.topic_nouns > self.nouns or self.topic_verbs > self.verbs:
            raise ValueError(f"topic_nouns/topic_verbs: a topic's subset cannot exceed its pool "
                             f"({self.nouns} nouns, {self.verbs} verbs), got {self.topic_nouns}, {self.topic_verbs}")
        if not 0 <= self.topic_share <= 1:
            raise ValueError(f"topic_share: expected a probability in [0, 1], got {self.topic_share!r}")
        if isinstance(self.zipf, bool) or not isinstance(self.zipf, (int, float)) or not 0 <= self.zipf <= 5:
            raise ValueError(f"zipf: expected an exponent in [0, 5], got {self.zipf!r}")
        for name, lo in (("names_per_doc", 1), ("sentences_per_doc", 1)):
            v = tuple(int(x) for x in getattr(self, name))
            if len(v) != 2 or v[0] < lo or v[1] < v[0]:
                raise ValueError(f"{name}: expected (min, max) with {lo} <= min <= max, got {getattr(self, name)!r}")
            object.__setattr__(self, name, v)
        if self.names_per_doc[1] > self.names:
            raise ValueError(f"names_per_doc: at most names={self.names} per document, got {self.names_per_doc}")
        sizes = tuple(int(s) for s in self.sizes)
        if len(sizes) != 3 or min(sizes) < 2:
            raise ValueError(f"sizes: expected three token counts >= 2 (train, val, test), got {self.sizes!r}")
        object.__setattr__(self, "sizes", sizes)

    def replace(self, **changes: Any) -> "TextParams":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    @property
    def vocab_size(self) -> int:
        """Size of the generated vocabulary (specials, function words and the four pools)."""
        return len(SPECIALS) + len(_FUNCTION_WORDS) + self.nouns + self.verbs + self.adjectives + self.names


#: ``small``: the CPU configs (a vocabulary of 1,189 words, 200k training tokens); ``tiny``: tests;
#: ``default``: a WikiText-2-sized corpus (2M training tokens).
PRESETS: dict[str, dict[str, Any]] = {
    "default": dict(sizes=(2_000_000, 200_000, 200_000)),
    "small": dict(topics=16, nouns=400, verbs=100, adjectives=60, names=600, topic_nouns=40, topic_verbs=12,
                  sizes=(200_000, 20_000, 20_000)),
    "tiny": dict(topics=4, nouns=60, verbs=20, adjectives=10, names=40, topic_nouns=12, topic_verbs=5,
                 sentences_per_doc=(3, 8), sizes=(4000, 800, 800)),
}


def resolve_params(p: str | TextParams | Mapping[str, Any]) -> TextParams:
    """A :class:`TextParams` from a preset name, an instance or a mapping of field values."""
    if isinstance(p, TextParams):
        return p
    if isinstance(p, str):
        if p not in PRESETS:
            raise ValueError(f"preset: unknown text preset {p!r}; valid presets: {sorted(PRESETS)}")
        return TextParams(**PRESETS[p])
    if isinstance(p, Mapping):
        return TextParams(**dict(p))
    raise ValueError(f"params: expected a preset name, TextParams or mapping, got {type(p).__name__}")


@dataclass
class Corpus:
    """A vocabulary and one token stream per split (int32 ids into ``vocab``)."""

    vocab: list[str]
    streams: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.vocab)


# ============================================================================ generator
def _pseudo_words(first: int, count: int, capital: bool = False) -> list[str]:
    """``count`` distinct pronounceable words: word j spells the number first + j in base-70
    syllables (three of them), so different (first, count) ranges never collide."""
    out = []
    for j in range(first, first + count):
        a, r = divmod(j, 70 * 70)
        b, c = divmod(r, 70)
        w = _SYLLABLES[a % 70] + _SYLLABLES[b] + _SYLLABLES[c]
        out.append(w.capitalize() if capital else w)
    return out


def _zipf(n: int, s: float) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return p / p.sum()


class _World:
    """Vocabulary, pools and topic subsets drawn once from the seed (shared by every split)."""

    def __init__(self, params: TextParams, seed: int) -> None:
        p = params
        rng = np.random.default_rng([int(seed), 31337, 0])
        sizes = (p.nouns, p.verbs, p.adjectives, p.names)
        starts = np.cumsum((0,) + sizes[:-1])
        nouns, verbs, adjs = (_pseudo_words(int(s), n) for s, n in zip(starts[:3], sizes[:3]))
        names = _pseudo_words(int(starts[3]), p.names, capital=True)
        self.vocab = [*SPECIALS, *_FUNCTION_WORDS, *nouns, *verbs, *adjs, *names]
        self.index = {w: i for i, w in enumerate(self.vocab)}
        base = len(SPECIALS) + len(_FUNCTION_WORDS)
        self.noun_ids = np.arange(base, base + p.nouns)
        self.verb_ids = self.noun_ids[-1] + 1 + np.arange(p.verbs)
        self.adj_ids = self.verb_ids[-1] + 1 + np.arange(p.adjectives)
        self.name_ids = self.adj_ids[-1] + 1 + np.arange(p.names)
        # global frequency orders (a random permutation ranks each pool) and per-topic subsets
        self.noun_rank, self.verb_rank = rng.permutation(self.noun_ids), rng.permutation(self.verb_ids)
        self.adj_rank = rng.permutation(self.adj_ids)
        self.topic_nouns = np.stack([rng.choice(self.noun_ids, p.topic_nouns, replace=False) for _ in range(p.topics)])
        self.topic_verbs = np.stack([rng.choice(self.verb_ids, p.topic_verbs, replace=False) for _ in range(p.topics)])
        self.params = p
        zipf_sizes = {"topic_nouns": p.topic_nouns, "topic_verbs": p.topic_verbs, "nouns": p.nouns,
                      "verbs": p.verbs, "adjectives": p.adjectives}
        self.cdf = {k: np.cumsum(_zipf(n, p.zipf))[:-1] for k, n in zipf_sizes.items()}
        self.cdf.update(dets=np.cumsum(_zipf(len(_DETS), 1.0))[:-1], preps=np.cumsum(_zipf(len(_PREPS), 1.0))[:-1])
        self.det_ids = [self.index[d] for d in _DETS]
        self.prep_ids = [self.index[d] for d in _PREPS]

    def w(self, word: str) -> int:
        return self.index[word]


def _document(world: _World, rng: np.random.Generator, out: list[int]) -> None:
    """Append one document's tokens to ``out`` (module doc: heading, paragraphs, templates)."""
    p, w = world.params, world.w
    topic = int(rng.integers(p.topics))
    k = int(rng.integers(p.names_per_doc[0], p.names_per_doc[1] + 1))
    people = rng.choice(world.name_ids, k, replace=False)
    cdf = world.cdf

    def draw(name: str) -> int:  # an index drawn from the Zipf distribution ``name``
        return int(np.searchsorted(cdf[name], rng.random(), side="right"))

    def noun() -> int:
        if rng.random() < p.topic_share:
            return int(world.topic_nouns[topic][draw("topic_nouns")])
        return int(world.noun_rank[draw("nouns")])

    def verb() -> int:
        if rng.random() < p.topic_share:
            return int(world.topic_verbs[topic][draw("topic_verbs")])
        return int(world.verb_rank[draw("verbs")])

    def adj() -> int:
        return int(world.adj_rank[draw("adjectives")])

    def person() -> int:
        return int(people[rng.integers(k)])

    def det() -> int:
        return world.det_ids[draw("dets")]

    def prep() -> int:
        return world.prep_ids[draw("preps")]

    def subject() -> list[int]:
        return [person()] if rng.random() < 0.6 else [w(_PRONOUNS[int(rng.integers(len(_PRONOUNS)))])]

    def phrase() -> list[int]:
        return [det(), *([adj()] if rng.random() < 0.4 else []), noun()]

    def sentence() -> list[int]:
        t = int(rng.integers(4))
        if t == 0:
            s = [*subject(), verb(), *phrase(), prep(), *phrase()]
        elif t == 1:
            s = [*subject(), w("was"), *phrase(), w(","), w("and"), verb(), *phrase()]
        elif t == 2:
            s = [*phrase(), w("of"), person(), w("is"), adj(), w("that"), *subject(), verb(), *phrase()]
        else:
            s = [person(), w("and"), person(), verb(), *phrase(), prep(), noun(), w("@-@"), noun()]
        return s + [w(".")]

    out += [w("="), int(people[0]), w("="), EOS]
    n_sent = int(rng.integers(p.sentences_per_doc[0], p.sentences_per_doc[1] + 1))
    left = n_sent
    while left > 0:
        para = min(left, int(rng.integers(2, 7)))
        for _ in range(para):
            out += sentence()
        out.append(EOS)
        left -= para
        if left > 0 and rng.random() < 0.2:  # a section heading now and then
            out += [w("="), w("="), noun(), w("="), w("="), EOS]


def generate_corpus(params: str | TextParams | Mapping[str, Any], seed: int = 0) -> Corpus:
    """The stand-in corpus: one vocabulary, documents for train/val/test (module doc).

    Splits draw their documents from separate seeded streams of the same world (vocabulary,
    topics, names), each up to its token count from ``params.sizes``.
    """
    p = resolve_params(params)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    world = _World(p, int(seed))
    streams = {}
    for i, split in enumerate(SPLITS):
        rng = np.random.default_rng([int(seed), 31337, 1 + i])
        toks: list[int] = []
        while len(toks) < p.sizes[i]:
            _document(world, rng, toks)
        streams[split] = np.asarray(toks[:p.sizes[i]], dtype=np.int32)
    return Corpus(world.vocab, streams)


def load_generated_corpus(preset: str | TextParams | Mapping[str, Any], cache_dir: str | os.PathLike | None = None,
                          seed: int = 0) -> Corpus:
    """:func:`generate_corpus`, cached on disk keyed by the parameters and seed."""
    params = resolve_params(preset)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    key = {"generator": "pointformers.language", "version": GENERATOR_VERSION, "params": params.to_dict(),
           "seed": int(seed)}
    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "language"

    def build() -> dict[str, np.ndarray]:
        c = generate_corpus(params, seed)
        return {"vocab": np.array(c.vocab, dtype=np.str_), **c.streams}

    def validate(a: Mapping[str, np.ndarray]) -> None:
        if len(a["vocab"]) != params.vocab_size or any(len(a[s]) != n for s, n in zip(SPLITS, params.sizes)):
            raise ValueError("cache entry does not match its parameters")

    arrays = cached_arrays(root, preset if isinstance(preset, str) else "custom", key, build, validate)
    return Corpus([str(w) for w in arrays["vocab"]], {s: np.asarray(arrays[s], np.int32) for s in SPLITS})


# ============================================================================ WikiText files
def read_token_lines(path: str | os.PathLike):
    """Yield ``(line number, words)`` for every line of a tokenised text file (blank lines too).

    ValueError naming the file (and line) if it is missing, not UTF-8 or holds the padding word."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found (expected a WikiText-style .tokens file)")
    with open(path, "rb") as f:
        for no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path}:{no}: not UTF-8 text") from None
            words = line.split()
            if SPECIALS[PAD] in words:
                raise ValueError(f"{path}:{no}: the word {SPECIALS[PAD]!r} is reserved for padding")
            yield no, words


def build_vocabulary(path: str | os.PathLike, max_vocab: int | None = None) -> list[str]:
    """The specials, then every word of ``path`` by descending count (ties: first appearance),
    at most ``max_vocab`` entries in all (None: every word)."""
    if max_vocab is not None and (isinstance(max_vocab, bool) or not isinstance(max_vocab, int)
                                  or max_vocab <= len(SPECIALS)):
        raise ValueError(f"max_vocab: expected an integer > {len(SPECIALS)} or None, got {max_vocab!r}")
    counts: Counter = Counter()
    lines = 0
    for _, words in read_token_lines(path):
        counts.update(words)
        lines += 1
    if lines == 0:
        raise ValueError(f"{path}: the file is empty")
    for s in SPECIALS[1:]:
        counts.pop(s, None)  # <unk> (WikiText's own) and <eos> keep their fixed ids
    words = [w for w, _ in counts.most_common()]  # most_common keeps first-appearance order for ties
    vocab = [*SPECIALS, *words]
    return vocab[:max_vocab] if max_vocab is not None else vocab


def encode_token_file(path: str | os.PathLike, index: Mapping[str, int]) -> np.ndarray:
    """The words of ``path`` as ids (int32), ``<eos>`` after every line, unknown words as ``<unk>``."""
    ids = array("i")  # 4 bytes per token (WikiText-103's 103M tokens: 0.4 GB, not a list of Python ints)
    get = index.get
    for _, words in read_token_lines(path):
        ids.extend([get(w, UNK) for w in words])
        ids.append(EOS)
    if not ids:
        raise ValueError(f"{path}: the file is empty")
    return np.frombuffer(ids, dtype=np.int32).copy()


def load_wikitext(root: str | os.PathLike, splits: Sequence[str] = SPLITS, max_vocab: int | None = None,
                  cache_dir: str | os.PathLike | None = None) -> Corpus:
    """The splits of a WikiText folder (``wiki.train.tokens``, ``wiki.valid.tokens``,
    ``wiki.test.tokens``; the vocabulary always from the training file). With ``cache_dir``, the
    encoded streams are kept there, keyed by the files' sizes and modification times."""
    root = Path(root).expanduser()
    bad = [s for s in splits if s not in WIKITEXT_FILES]
    if bad:
        raise ValueError(f"splits: expected names among {list(WIKITEXT_FILES)}, got {bad}")
    files = {s: root / WIKITEXT_FILES[s] for s in dict.fromkeys(["train", *splits])}
    for s, f in files.items():
        if not f.is_file():
            raise ValueError(f"data.root: {f} not found (expected WikiText's {', '.join(WIKITEXT_FILES.values())})")

    def build() -> dict[str, np.ndarray]:
        vocab = build_vocabulary(files["train"], max_vocab)
        index = {w: i for i, w in enumerate(vocab)}
        return {"vocab": np.array(vocab, dtype=np.str_), **{s: encode_token_file(files[s], index) for s in splits}}

    if cache_dir is None:
        arrays = build()
    else:
        stamp = {s: [f.stat().st_size, f.stat().st_mtime_ns] for s, f in files.items()}
        key = {"reader": "pointformers.language.wikitext", "version": GENERATOR_VERSION, "root": str(root.resolve()),
               "files": stamp, "splits": list(splits), "max_vocab": max_vocab}
        arrays = cached_arrays(Path(cache_dir) / "language", "wikitext", key, build)
    return Corpus([str(w) for w in arrays["vocab"]], {s: np.asarray(arrays[s], np.int32) for s in splits})


def write_token_file(path: str | os.PathLike, vocab: Sequence[str], ids: np.ndarray) -> None:
    """Write a stream as a WikiText-style file: one line per ``<eos>``-terminated run of words
    (the inverse of :func:`encode_token_file` for a stream that ends with ``<eos>``)."""
    lines, cur = [], []
    for i in np.asarray(ids).tolist():
        if i == EOS:
            lines.append(" ".join(cur))
            cur = []
        else:
            cur.append(vocab[i])
    if cur:
        lines.append(" ".join(cur))
    Path(path).write_text("".join(f" {ln} \n" if ln else "\n" for ln in lines), encoding="utf-8")


def lm_windows(stream: np.ndarray, block_len: int) -> list[np.ndarray]:
    """The stream cut into non-overlapping blocks of ``block_len`` predicted tokens: window i is
    ``stream[i·L : i·L + L + 1]`` (inputs its first L ids, targets its last L), so every token
    after the first is predicted exactly once, each block without the previous one's context (FLT's
    protocol: "trained without access to the context from previous mini-batches"). The last
    window may be shorter (at least 2 ids)."""
    if isinstance(block_len, bool) or not isinstance(block_len, (int, np.integer)) or block_len < 1:
        raise ValueError(f"block_len: expected an integer >= 1, got {block_len!r}")
    n = len(stream)
    if n < 2:
        raise ValueError(f"stream: need at least 2 tokens to predict one, got {n}")
    return [stream[a:a + block_len + 1] for a in range(0, n - 1, block_len)]
