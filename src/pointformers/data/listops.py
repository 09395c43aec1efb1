"""ListOps (Long Range Arena): grammar generator, exact evaluator, vocabulary and TSV reader.

Grammar (LRA's ``listops.py``, after Nangia & Bowman 2018): an expression is a digit 0–9 or
``[OP a1 ... ak ]`` with OP in MIN, MAX, MED (median, truncated to an integer as LRA's
``int(np.median(.))`` does), SM (sum modulo 10) and 2 <= k <= ``max_args`` arguments, each an
expression. Generation is LRA's recursion: at depth < ``max_depth`` a node is an operator
with probability ``1 - value_p`` (``value_p = 0.25``), else a uniform digit; at the maximum
depth it is a digit. Expressions are kept when ``min_length < length < max_length`` where
length counts operators, digits and ``]`` (LRA: max_depth 10, max_args 10, lengths in
(500, 2000), 96k/2k/2k train/val/test, distinct expressions). The label (10 classes) is the
value.

Text form: LRA writes each nested application with parentheses, e.g.
``( ( ( [MAX 2 ) 9 ) ] )``; the parentheses carry no information (the prefix form with
``]`` is unambiguous), so the tokenizer drops them by default (as the common LRA pipelines
do) and the token count equals the length above. Vocabulary: ``<pad>`` = 0, ``<cls>``, the
digits, the four operators, ``]`` (and ``(``, ``)`` when ``keep_parens``).

The reader takes LRA's ``basic_{train,val,test}.tsv`` (header ``Source<TAB>Target``) and
rejects malformed rows with the file and line.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .cache import cached_arrays, default_cache_dir

__all__ = ["OPERATORS", "VOCAB", "ListOpsParams", "generate_expression", "to_lra_string", "tokenize", "evaluate",
           "encode", "read_listops_tsv", "write_listops_tsv", "load_listops_dataset", "generate_listops",
           "ListOpsSet"]

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
DIGITS = tuple(str(d) for d in range(10))
PAD, CLS = "<pad>", "<cls>"
#: Token -> id. ``(`` and ``)`` are only produced with ``keep_parens``.
VOCAB: dict[str, int] = {t: i for i, t in enumerate((PAD, CLS, *DIGITS, *OPERATORS, END, "(", ")"))}
GENERATOR_VERSION = 1
SPLITS = ("train", "val", "test")


# ============================================================================ evaluation
def tokenize(source: str, keep_parens: bool = False) -> list[str]:
    """Whitespace tokens of an LRA source string, without ``(``/``)`` unless ``keep_parens``."""
    toks = source.split()
    return toks if keep_parens else [t for t in toks if t not in ("(", ")")]


def _apply(op: str, args: list[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        s = sorted(args)
        m = len(s) // 2
        # LRA: int(np.median(args)) -- the mean of the two middle values, truncated.
        return s[m] if len(s) % 2 else (s[m - 1] + s[m]) // 2
    return sum(args) % 10  # "[SM"


def evaluate(expression: str | Sequence[str]) -> int:
    """The exact value (0–9) of a ListOps expression (string or tokens; parentheses ignored).

    Iterative (stack-based), so depth is unlimited. Raises ValueError for an unknown token, an
    operator without arguments, an unbalanced ``]`` or trailing tokens.
    """
    toks = tokenize(expression) if isinstance(expression, str) else [t for t in expression if t not in ("(", ")")]
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for pos, t in enumerate(toks):
        if result is not None:
            raise ValueError(f"expression: trailing token {t!r} at position {pos} after a complete expression")
        if t in OPERATORS:
            stack.append((t, []))
        elif t == END:
            if not stack:
                raise ValueError(f"expression: unmatched ']' at position {pos}")
            op, args = stack.pop()
            if not args:
                raise ValueError(f"expression: operator {op} at position {pos} closed without arguments")
            v = _apply(op, args)
            if stack:
                stack[-1][1].append(v)
            else:
                result = v
        elif t in DIGITS:
            if stack:
                stack[-1][1].append(int(t))
            else:
                result = int(t)
        else:
            raise ValueError(f"expression: unknown token {t!r} at position {pos}; expected a digit, "
                             f"one of {list(OPERATORS)} or ']'")
    if stack:
        raise ValueError(f"expression: {len(stack)} operator(s) not closed by ']'")
    if result is None:
        raise ValueError("expression: empty")
    return result


# ============================================================================ generation
Tree = Any  # int | tuple[str, list[Tree]]


class _Uniforms:
    """Uniform [0, 1) numbers drawn from ``rng`` in blocks (scalar draws dominate otherwise)."""

    def __init__(self, rng: np.random.Generator, block: int = 8192) -> None:
        self.rng, self.block = rng, block
        self.buf = rng.random(block).tolist()
        self.i = 0

    def __call__(self) -> float:
        if self.i == len(self.buf):
            self.buf = self.rng.random(self.block).tolist()
            self.i = 0
        self.i += 1
        return self.buf[self.i - 1]


def generate_expression(rng: np.random.Generator | _Uniforms, max_depth: int = 10, max_args: int = 10,
                        value_p: float = 0.25) -> tuple[Tree, int]:
    """One random tree (LRA's ``generate_tree(1, ...)``) and its length (digits, ops, ``]``).

    A tree is a digit or ``(op, [children])``. ``rng``: a numpy Generator (or the block
    sampler :func:`generate_listops` passes for speed).
    """
    u = rng if isinstance(rng, _Uniforms) else _Uniforms(rng, 256)
    n_ops = len(OPERATORS)

    def draw(depth: int) -> Any:
        if depth < max_depth and u() <= value_p:
            return [OPERATORS[int(u() * n_ops)], [], depth]
        return int(u() * 10)

    root = draw(1)
    if isinstance(root, int):
        return root, 1
    length = 0
    stack = [root]
    while stack:  # explicit stack: no recursion limit on deep trees
        op, children, depth = stack.pop()
        length += 2  # the operator and its ']'
        for _ in range(2 + int(u() * (max_args - 1))):  # k uniform in [2, max_args]
            c = draw(depth + 1)
            children.append(c)
            if isinstance(c, int):
                length += 1
            else:
                stack.append(c)
    return _freeze(root), length


def _freeze(node: Any) -> Tree:
    if isinstance(node, int):
        return node
    return node[0], [_freeze(c) for c in node[1]]


def to_lra_string(tree: Tree) -> str:
    """LRA's text form with parentheses: ``( ( ( [MAX 2 ) 9 ) ] )`` for ``[MAX 2 9 ]``."""
    if isinstance(tree, int):
        return str(tree)
    op, args = tree
    s = f"( {op} {to_lra_string(args[0])} )"
    for a in args[1:]:
        s = f"( {s} {to_lra_string(a)} )"
    return f"( {s} {END} )"


def tree_value(tree: Tree) -> int:
    if isinstance(tree, int):
        return tree
    return _apply(tree[0], [tree_value(a) for a in tree[1]])


@dataclass(frozen=True)
class ListOpsParams:
    """Generator parameters (LRA defaults) and split sizes (LRA: 96,000 / 2,000 / 2,000)."""

    max_depth: int = 10
    max_args: int = 10
    min_length: int = 500
    max_length: int = 2000
    value_p: float = 0.25
    sizes: tuple[int, int, int] = (96000, 2000, 2000)

    def __post_init__(self) -> None:
        for name in ("max_depth", "max_args", "min_length", "max_length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (2 if name == "max_args" else 0):
                raise ValueError(f"{name}: expected an integer >= {2 if name == 'max_args' else 0}, got {v!r}")
        if self.max_length <= self.min_length + 1:
            raise ValueError(f"max_length: expected > min_length + 1 = {self.min_length + 1}, got {self.max_length}")
        if not 0 < self.value_p < 1:
            raise ValueError(f"value_p: expected a probability in (0, 1), got {self.value_p!r}")
        sizes = tuple(int(s) for s in self.sizes)
        if len(sizes) != 3 or min(sizes) < 0:
            raise ValueError(f"sizes: expected three non-negative integers (train, val, test), got {self.sizes!r}")
        object.__setattr__(self, "sizes", sizes)

    def to_dict(self) -> dict[str, Any]:
        return {"max_depth": self.max_depth, "max_args": self.max_args, "min_length": self.min_length,
                "max_length": self.max_length, "value_p": self.value_p, "sizes": list(self.sizes)}


#: ``lra``: the real sizes; ``small``: CPU demo; ``tiny``: tests.
PRESETS: dict[str, dict[str, Any]] = {
    "lra": {},
    "small": dict(min_length=50, max_length=500, sizes=(4000, 500, 500)),
    "tiny": dict(min_length=10, max_length=120, sizes=(64, 16, 16)),
}


def resolve_params(p: str | ListOpsParams | Mapping[str, Any]) -> ListOpsParams:
    if isinstance(p, ListOpsParams):
        return p
    if isinstance(p, str):
        if p not in PRESETS:
            raise ValueError(f"preset: unknown ListOps preset {p!r}; valid presets: {sorted(PRESETS)}")
        return ListOpsParams(**PRESETS[p])
    if isinstance(p, Mapping):
        return ListOpsParams(**dict(p))
    raise ValueError(f"params: expected a preset name, ListOpsParams or mapping, got {type(p).__name__}")


def generate_listops(params: str | ListOpsParams | Mapping[str, Any], seed: int = 0,
                     max_tries: int | None = None) -> dict[str, list[tuple[str, int]]]:
    """Distinct (source, target) pairs for train/val/test, LRA style (rejection on length).

    One stream generates every split, then the distinct expressions are dealt out in order,
    so splits never share an expression.
    """
    params = resolve_params(params)
    rng = _Uniforms(np.random.default_rng([int(seed), 1729]))
    need = sum(params.sizes)
    seen: dict[str, int] = {}
    tries = 0
    limit = max_tries if max_tries is not None else 2000 * need + 10000
    while len(seen) < need:
        tries += 1
        if tries > limit:
            raise ValueError(f"params: could not find {need} expressions with length in "
                             f"({params.min_length}, {params.max_length}) after {limit} tries")
        tree, length = generate_expression(rng, params.max_depth, params.max_args, params.value_p)
        if params.min_length < length < params.max_length:
            s = to_lra_string(tree)
            if s not in seen:
                seen[s] = tree_value(tree)
    items = list(seen.items())
    a, b = params.sizes[0], params.sizes[0] + params.sizes[1]
    return {"train": items[:a], "val": items[a:b], "test": items[b:]}


# ============================================================================ encoding / IO
@dataclass
class ListOpsSet:
    """Token id sequences (ragged) and labels. ``tokens[i]``: (L_i,) int64; ``labels``: (S,)."""

    tokens: list[np.ndarray]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)


def encode(source: str, keep_parens: bool = False, add_cls: bool = False, max_len: int | None = None) -> np.ndarray:
    """Token ids (L,) of a source string (``<cls>`` first when ``add_cls``; cut to ``max_len``)."""
    toks = tokenize(source, keep_parens)
    ids = [VOCAB[CLS]] if add_cls else []
    for i, t in enumerate(toks):
        if t not in VOCAB or t in (PAD, CLS):
            raise ValueError(f"source: unknown token {t!r} at position {i}")
        ids.append(VOCAB[t])
    arr = np.asarray(ids, np.int64)
    return arr if max_len is None else arr[:max_len]


def write_listops_tsv(path: str | os.PathLike, rows: Iterable[tuple[str, int]]) -> None:
    """Write LRA's TSV: header ``Source\\tTarget`` then one ``source\\ttarget`` row each."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("Source\tTarget\n")
        for s, t in rows:
            f.write(f"{s}\t{int(t)}\n")


def read_listops_tsv(path: str | os.PathLike, check_values: bool = False) -> list[tuple[str, int]]:
    """(source, target) rows of an LRA ListOps TSV file.

    A wrong header, a row without exactly two tab-separated fields, a target that is not an
    integer in 0–9, or a source that does not parse as a ListOps expression raises
    ValueError naming the file and line; ``check_values`` also requires target ==
    :func:`evaluate` (source).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    rows = []
    with open(path, encoding="utf-8", newline="") as f:
        header = f.readline().rstrip("\r\n").split("\t")
        if header != ["Source", "Target"]:
            raise ValueError(f"{path}:1: expected the header 'Source<TAB>Target', got {header!r}")
        for i, ln in enumerate(f, start=2):
            ln = ln.rstrip("\r\n")
            if not ln.strip():
                continue
            fields = ln.split("\t")
            if len(fields) != 2:
                raise ValueError(f"{path}:{i}: expected 2 tab-separated fields (Source, Target), got {len(fields)}")
            src, tgt = fields
            try:
                target = int(tgt.strip())
            except ValueError:
                raise ValueError(f"{path}:{i}: expected an integer target 0-9, got {tgt!r}") from None
            if not 0 <= target <= 9:
                raise ValueError(f"{path}:{i}: expected a target in 0-9, got {target}")
            try:
                value = evaluate(src)
            except ValueError as e:
                raise ValueError(f"{path}:{i}: malformed source: {e}") from None
            if check_values and value != target:
                raise ValueError(f"{path}:{i}: target {target} differs from the expression's value {value}")
            rows.append((src, target))
    return rows


def _to_set(rows: Sequence[tuple[str, int]], keep_parens: bool, add_cls: bool, max_len: int | None) -> ListOpsSet:
    return ListOpsSet([encode(s, keep_parens, add_cls, max_len) for s, _ in rows],
                      np.asarray([t for _, t in rows], np.int64))


def load_listops_dataset(
    preset: str | ListOpsParams | Mapping[str, Any],
    split: str,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    keep_parens: bool = False,
    add_cls: bool = False,
    max_len: int | None = None,
) -> ListOpsSet:
    """Generated ListOps ``split`` as token ids, cached on disk keyed by the parameters."""
    params = resolve_params(preset)
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    key = {"generator": "pointformers.listops", "version": GENERATOR_VERSION, "params": params.to_dict(),
           "seed": int(seed)}
    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "listops"
    name = preset if isinstance(preset, str) else "custom"

    def build() -> dict[str, np.ndarray]:
        data = generate_listops(params, seed)
        out = {}
        for sp in SPLITS:
            out[f"{sp}_source"] = np.array([s for s, _ in data[sp]], dtype=np.str_)
            out[f"{sp}_target"] = np.array([t for _, t in data[sp]], np.int64)
        return out

    arrays = cached_arrays(root, name, key, build)
    rows = list(zip((str(s) for s in arrays[f"{split}_source"]), (int(t) for t in arrays[f"{split}_target"])))
    return _to_set(rows, keep_parens, add_cls, max_len)


def load_listops_tsv(path: str | os.PathLike, keep_parens: bool = False, add_cls: bool = False,
                     max_len: int | None = None) -> ListOpsSet:
    """An LRA TSV file (e.g. ``listops-1000/basic_test.tsv``) as token ids and labels."""
    return _to_set(read_listops_tsv(path), keep_parens, add_cls, max_len)
