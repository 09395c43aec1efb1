"""The rule by which a benchmark decides a claim on several seeds (docs/results.md states it).

A comparison of two configs is decided only on at least :data:`MIN_SEEDS` seeds each, and holds
only when the difference of the seed means clears its bar by more than the seeds' spread, the sum
of the two configs' sample standard deviations over seeds; a difference inside the spread does not
hold. :mod:`.point_results` and :mod:`.hep_comparison` decide their claims with it.
"""
from __future__ import annotations

import statistics
from typing import Sequence

__all__ = ["MIN_SEEDS", "spread", "compare", "verdict", "mean_std"]

#: Fewest seeds per config on which a comparison is decided (:func:`compare`).
MIN_SEEDS = 3


def spread(a: Sequence[float], b: Sequence[float]) -> float:
    """The seeds' spread of a comparison of two configs: the sum of their sample standard deviations
    over seeds (0 for a single seed). A difference of means counts only beyond it (see
    :func:`compare`)."""
    return sum(statistics.stdev(v) if len(v) > 1 else 0.0 for v in (a, b))


def compare(a: Sequence[float], b: Sequence[float], margin: float = 0.0) -> str:
    """Decide "mean(a) − mean(b) > −margin beyond the seeds' spread": ``"holds"`` when
    mean(a) − mean(b) − :func:`spread` > −margin (the pessimistic end of the difference still
    clears it), ``"fails"`` when mean(a) − mean(b) + spread ≤ −margin (even the optimistic end
    does not), otherwise ``"within spread"`` (the seeds cannot tell). ``margin`` 0: a beats b;
    ``margin`` > 0: a is within ``margin`` of b or above. Fewer than :data:`MIN_SEEDS` seeds on
    either side: ``"undecided"``."""
    if min(len(a), len(b)) < MIN_SEEDS:
        return "undecided"
    d, sp = statistics.fmean(a) - statistics.fmean(b), spread(a, b)
    if d - sp > -margin:
        return "holds"
    return "fails" if d + sp <= -margin else "within spread"


def verdict(outcomes: Sequence[str]) -> str:
    """One claim's label from its comparisons' outcomes (:func:`compare`): HOLDS only when every one holds."""
    if not outcomes or "undecided" in outcomes:
        return f"UNDECIDED (fewer than {MIN_SEEDS} seeds)"
    return "HOLDS" if all(o == "holds" for o in outcomes) else "DOES NOT HOLD"


def mean_std(vals: Sequence[float], spec: str = ".1f") -> str:
    """``"mean ± std"`` over seeds in format ``spec`` (the value alone for one seed, ``"n/a"`` for none)."""
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return format(vals[0], spec)
    return f"{format(statistics.fmean(vals), spec)} ± {format(statistics.stdev(vals), spec)}"
