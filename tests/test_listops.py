"""ListOps: exact evaluator on hand-written expressions, LRA generator properties, TSV reader."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pointformers.data import listops as L


@pytest.mark.parametrize("expr, value", [
    ("7", 7),
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[MIN [MAX 1 2 ] [SM 9 9 ] ]", 2),  # min(2, 18 mod 10 = 8)
    ("[SM 5 6 7 ]", 8),
    ("[MED 3 1 2 ]", 2),
    ("[MED 1 2 3 4 ]", 2),  # LRA: int(np.median) = int(2.5)
    ("[MED 0 1 ]", 0),
    ("[MED 8 9 ]", 8),
    ("[MAX [MED [SM 4 4 4 ] 1 9 ] [MIN 5 [MAX 3 6 ] ] ]", 5),  # max(med(2,1,9)=2, min(5,6)=5)
    ("( ( ( [MAX 2 ) 9 ) ] )", 9),  # LRA's parenthesised text
])
def test_evaluator_on_hand_written_expressions(expr: str, value: int) -> None:
    assert L.evaluate(expr) == value


def test_median_matches_numpy_truncation() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        args = rng.integers(0, 10, rng.integers(2, 11)).tolist()
        assert L.evaluate("[MED " + " ".join(map(str, args)) + " ]") == int(np.median(args))


@pytest.mark.parametrize("bad", ["", "[MAX 1 2", "[MAX ]", "1 2", "[FOO 1 ]", "[MIN 1 ] ]", "[SM 1 x ]"])
def test_evaluator_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="expression"):
        L.evaluate(bad)


def test_lra_string_form_and_lengths() -> None:
    tree = ("[MAX", [2, ("[MIN", [4, 7]), 9])
    s = L.to_lra_string(tree)
    assert s == "( ( ( ( [MAX 2 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 9 ) ] )"
    assert L.evaluate(s) == 9 and L.tokenize(s) == "[MAX 2 [MIN 4 7 ] 9 ]".split()
    rng = np.random.default_rng(1)
    for _ in range(200):
        tree, length = L.generate_expression(rng, max_depth=6, max_args=5)
        toks = L.tokenize(L.to_lra_string(tree))
        assert len(toks) == length
        assert L.evaluate(toks) == L.tree_value(tree)
        # Depth and arity limits of the grammar.
        depth, max_d = 0, 0
        for t in toks:
            depth += t in L.OPERATORS
            depth -= t == "]"
            max_d = max(max_d, depth)
        assert max_d <= 5  # operators only above max_depth
        if not isinstance(tree, int):
            assert 2 <= len(tree[1]) <= 5


def test_generated_splits_are_distinct_bounded_and_deterministic() -> None:
    params = L.ListOpsParams(min_length=10, max_length=80, sizes=(40, 10, 10))
    a = L.generate_listops(params, seed=3)
    b = L.generate_listops(params, seed=3)
    assert a == b and a != L.generate_listops(params, seed=4)
    sources = [s for sp in a.values() for s, _ in sp]
    assert len(set(sources)) == 60
    for sp in a.values():
        for s, v in sp:
            assert 10 < len(L.tokenize(s)) < 80 and L.evaluate(s) == v


def test_tsv_round_trip_and_encoding(tmp_path: Path) -> None:
    rows = L.generate_listops("tiny", seed=0)["test"]
    f = tmp_path / "basic_test.tsv"
    L.write_listops_tsv(f, rows)
    assert f.read_text().splitlines()[0] == "Source\tTarget"
    assert L.read_listops_tsv(f, check_values=True) == rows
    ds = L.load_listops_tsv(f, add_cls=True)
    assert len(ds) == len(rows) and ds.labels.tolist() == [t for _, t in rows]
    ids = L.encode("( ( [SM 3 ) 4 ) ] )")
    assert ids.tolist() == [L.VOCAB["[SM"], L.VOCAB["3"], L.VOCAB["4"], L.VOCAB["]"]]
    assert ds.tokens[0][0] == L.VOCAB["<cls>"]
    assert L.encode("( [SM 3 ] )", keep_parens=True).tolist()[0] == L.VOCAB["("]


@pytest.mark.parametrize("content, msg", [
    ("Src\tTarget\n[MAX 1 2 ]\t2\n", ":1: expected the header"),
    ("Source\tTarget\n[MAX 1 2 ]\t2\textra\n", ":2: expected 2 tab-separated"),
    ("Source\tTarget\n[MAX 1 2 ]\t2\n[MAX 1 2 ]\tbig\n", ":3: expected an integer target"),
    ("Source\tTarget\n[MAX 1 2 ]\t12\n", ":2: expected a target in 0-9"),
    ("Source\tTarget\n[MAX 1 2\t2\n", ":2: malformed source"),
])
def test_tsv_reader_rejects_malformed_files(tmp_path: Path, content: str, msg: str) -> None:
    f = tmp_path / "bad.tsv"
    f.write_text(content)
    with pytest.raises(ValueError, match=str(f).replace("\\", "\\\\") + msg.replace("(", r"\(")):
        L.read_listops_tsv(f)


def test_tsv_value_check_and_cache(tmp_path: Path) -> None:
    f = tmp_path / "x.tsv"
    f.write_text("Source\tTarget\n[MAX 1 2 ]\t1\n")
    assert L.read_listops_tsv(f) == [("[MAX 1 2 ]", 1)]
    with pytest.raises(ValueError, match=":2: target 1 differs"):
        L.read_listops_tsv(f, check_values=True)
    a = L.load_listops_dataset("tiny", "train", cache_dir=tmp_path)
    assert len(list((tmp_path / "listops").glob("tiny-*.npz"))) == 1
    b = L.load_listops_dataset("tiny", "train", cache_dir=tmp_path)
    assert all(np.array_equal(x, y) for x, y in zip(a.tokens, b.tokens)) and np.array_equal(a.labels, b.labels)
    assert len(a) == 64 and set(a.labels.tolist()) <= set(range(10))
    with pytest.raises(ValueError, match="max_length"):
        L.ListOpsParams(min_length=100, max_length=50)
