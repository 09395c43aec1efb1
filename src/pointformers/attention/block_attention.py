"""Block-diagonal exp-kernel attention over separately sorted queries and keys, fused.

This is the compute core of HEPT (and of the OR-only LSH ablation). For every group g
(one cloud × one head) and OR table t, queries and keys are each permuted by their own sort
order and cut into blocks of ``b``; query block j attends only to key block j with weights
exp(min(0, q'·k')). Numerators and denominators are summed over tables before the
division, with 1e−20 added per table (HEPT paper §4.2 and the authors' code).

HEPT's RBF kernel exp(−½‖q̂ − k̂‖²) is exp of a plain dot product of augmented rows
q' = [q̂, −½‖q̂‖², 1] and k' = [k̂, 1, −½‖k̂‖²], so every chunk of blocks is
GEMM → clamp/exp → GEMM. The denominator is the last column of the value rows
v' = [v, 1] (a padded key's row is all 0, so padded keys add nothing).

Why a custom autograd function: the straightforward version materialises every block's
score matrix (T·G·n·b numbers), keeps it for the backward pass (far more memory than
full attention with a fused kernel) and spends its time in elementwise passes. Here:

* blocks are processed in chunks whose scores stay in cache, each chunk's results added
  back to point order with ``index_add_`` (no score matrix outlives its chunk);
* the backward pass recomputes each chunk's scores instead of storing them (as
  FlashAttention does): training memory is q̂, k̂, v, the permutations and the output,
  about what full attention with a fused kernel keeps.
"""
from __future__ import annotations

import torch

from ..nn import fast_linear
from ..nn.model_inputs import is_tracing
from .kernel import DENOM_EPS

#: Default groups (cloud × head) per block-attention chunk of the static (export) path; None = all
#: at once. A memory/speed knob of the exported graph (see :func:`static_block_sums`).
DEFAULT_GROUP_CHUNK: int | None = None

#: Lower clamp of the logits. CPU exp takes a much slower path below about −88, so
#: logits are clamped to −87 first: exp(−87) ≈ 1.6e−38 instead of an underflowed 0. With at
#: most T·b such terms per query this moves a sum by < 1e−35, far below the 1e−20 per-table
#: denominator guard, so outputs are unchanged.
LOGIT_FLOOR = -87.0

#: Lower clamp of the base-2 logits of the fused path below float64: scores are at least 2^−100
#: (7.9e−31). Near e^−87 a score times a value row underflows to a subnormal number, and a GEMM
#: producing or reading subnormals takes a microcode assist per product on many x86 CPUs (a
#: batched block GEMM of such scores ran 84× slower on one; HEPT training 3× slower). The floor
#: adds at most T·b·2^−100 (2.4e−28 for 3 tables of 100) to a denominator of at least T·1e−20: a
#: relative 8e−9, below float32's resolution, so the function is unchanged at its precision.
SCORE_FLOOR_LOG2 = -100.0

#: Target number of score entries per chunk: 2 MB of float32 scores, a core's L2 on the benchmarks'
#: CPU. Published model, 2 threads, alternated: 6k hits 0.208 / 0.205 s against 0.228 / 0.213 s
#: with 2^18 (minimum of 15 calls, two rounds), 60k hits unchanged (1.67-1.73 s either way).
DEFAULT_CHUNK_ELEMS = 1 << 19

#: Largest layer (rows × heads × tables × block size score entries, 5 bytes each) whose training
#: forward keeps its scores for the backward pass instead of the backward recomputing them (one of
#: seven block GEMMs and the exponentials per chunk): 2^24 entries are 84 MB per layer, a 6k-hit
#: cloud with HEPT's 8 heads, 3 tables and blocks of 100.
STORE_SCORES_MAX = 1 << 24

#: The default chunk is this many times larger in CPU training (2^20 scores): a training step runs
#: each chunk's kernels twice (forward, recomputing backward), and at the demo's 2-3k-hit clouds the
#: per-kernel overhead of several chunks per head outweighs the cache (demo step at 2 threads: 4.31
#: against 4.09 clouds/s with 2^18-score chunks, two alternated rounds; docs/benchmarks.md, "Notes
#: on HEPT's CPU kernels").
TRAIN_CHUNK_FACTOR = 2

#: The same on a GPU (64 M scores, 256 MB in float32): there each chunk costs a handful of kernel
#: launches, so small chunks leave it launch-bound (docs/benchmarks.md, "GPU notes").
DEFAULT_GPU_CHUNK_ELEMS = 1 << 26


def chunk_blocks_for(chunk_elems: int, block_size: int, like: torch.Tensor) -> int:
    """Blocks per chunk; the default chunk size means :data:`DEFAULT_GPU_CHUNK_ELEMS` off the CPU."""
    if chunk_elems == DEFAULT_CHUNK_ELEMS and like.device.type != "cpu":
        chunk_elems = DEFAULT_GPU_CHUNK_ELEMS
    return max(1, chunk_elems // (block_size * block_size))


def _rows(mat: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows of ``mat`` (R, C) at block indices ``idx`` (c, b) -> (c, b, C); index_select is a row memcpy."""
    return mat.index_select(0, idx.reshape(-1)).view(*idx.shape, mat.shape[1])


#: log2(e): below float64 the fused path computes exp(l) as 2^(l·log2 e), the factor applied by
#: the GEMM itself (its alpha), because the CPU's vectorised exp2 is about 3× faster than its exp
#: (both value-independent; docs/benchmarks.md, "Notes on HEPT's CPU kernels"). The result differs
#: from exp(l) by float rounding only; float64, the precision of exact comparisons with the
#: authors' code, keeps exp itself.
LOG2E = 1.4426950408889634


def _scores(logits: torch.Tensor) -> torch.Tensor:
    """exp(clamp(logits, −87, 0)), in place. (c, b, b)."""
    return logits.clamp_(LOGIT_FLOOR, 0.0).exp_()


def _clamped(logits: torch.Tensor) -> torch.Tensor | None:
    """Where the clamp at 0 passes no gradient: the mask logits > 0, or None when no logit is positive.
    The RBF logit −½‖q̂ − k̂‖² is never positive; only rounding makes a few so, mostly none in a
    chunk, and a max is cheaper than writing the mask and applying it in the backward pass."""
    if is_tracing():  # no data-dependent branch in a traced graph
        return logits > 0
    return logits > 0 if bool(logits.max() > 0) else None


def logit_floor(dtype: torch.dtype) -> float:
    """The lower clamp of natural-log logits: :data:`LOGIT_FLOOR` in float64, the fused path's
    :data:`SCORE_FLOOR_LOG2` (in natural units) below it."""
    return LOGIT_FLOOR if dtype == torch.float64 else SCORE_FLOOR_LOG2 / LOG2E


def _chunk_logits(Q: torch.Tensor, K: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The logits of a chunk of blocks in the form :func:`_chunk_scores` takes: log2(e)·Q Kᵀ below
    float64 (the scale is the GEMM's alpha), plain Q Kᵀ in float64. (c, b, D) ×2 -> (c, b, b),
    written into ``out`` if given."""
    if Q.dtype == torch.float64:
        return torch.bmm(Q, K.transpose(1, 2), out=out)
    base = out if out is not None else Q.new_zeros(()).expand(Q.shape[0], Q.shape[1], K.shape[1])
    return torch.baddbmm(base, Q, K.transpose(1, 2), beta=0.0, alpha=LOG2E, out=out)


def _chunk_scores(logits: torch.Tensor) -> torch.Tensor:
    """exp(clamp(l, −87, 0)) of :func:`_chunk_logits`' output, in place; below float64 as 2^(·) with the
    floor :data:`SCORE_FLOOR_LOG2`."""
    if logits.dtype == torch.float64:
        return _scores(logits)
    return logits.clamp_(SCORE_FLOOR_LOG2, 0.0).exp2_()


def augment_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor):
    """(R, D), (R, D), (R, dv), (R,) -> q' (R, D+2), k' (R, D+2), v' (R, dv+1); see module doc."""
    keep = key_valid[:, None].to(v.dtype)
    one = torch.ones_like(keep)
    qa = torch.cat([q, q.new_zeros(q.shape[0], 1), one], 1)
    ka = torch.cat([k, one, k.new_zeros(k.shape[0], 1)], 1)
    fill_norm_columns(qa, ka)
    return qa, ka, torch.cat([v * keep, keep], 1)


#: Rows per piece in which :func:`fill_norm_columns` squares and sums: a piece's temporary (2 MB at
#: 32 columns) stays in cache and is reused by the allocator, where one (P, D) temporary for a
#: million rows is a fresh 120 MB mapping, page-faulted in (96 ms a head, against 20 ms in pieces).
NORM_PIECE_ROWS = 16384


def fill_norm_columns(qa: torch.Tensor, ka: torch.Tensor) -> None:
    """Write −½‖q̂‖² into column D of q' and −½‖k̂‖² into column D+1 of k', in place.

    Done outside autograd on purpose: :class:`_SortedBlockAttention` folds the derivative of
    these columns into the gradient of q̂ / k̂ itself, so callers may build q', k' straight
    from one matmul (no concatenated copies kept for the backward pass).
    """
    D = qa.shape[-1] - 2
    with torch.no_grad():
        for rows, col in ((qa, D), (ka, D + 1)):
            if is_tracing() or not (rows.dim() == 2 or rows.is_contiguous()):  # one op (no loop in a graph)
                rows[..., col] = rows[..., :D].pow(2).sum(-1).mul_(-0.5)
                continue
            flat = rows if rows.dim() == 2 else rows.view(-1, D + 2)
            for s in range(0, flat.shape[0], NORM_PIECE_ROWS):
                piece = flat[s:s + NORM_PIECE_ROWS]
                piece[:, col] = piece[:, :D].pow(2).sum(-1).mul_(-0.5)


def _attend(qa, ka, va, iq, ik, block_size: int, chunk_blocks: int, out=None, keep: list | None = None,
            width: int | None = None, workspace: "HeadWorkspace | None" = None):
    """Forward loop. Returns out (R, dv) (written into ``out`` if given) and den (R,) = Σ_t denominators + T·1e−20.

    ``width``: the value rows' used columns dv + 1 ([v, 1]); columns past it (zero padding, see
    :func:`value_width`) are carried through the GEMMs and ignored. Default: all of va's columns.
    ``keep``: a list to which each chunk's scores and clamp mask are appended for the backward
    pass (:func:`_attend_backward`'s ``stored``), instead of it recomputing them. ``workspace``
    (inference on many rows, see :class:`HeadWorkspace`): every chunk's results are written in
    block layout into its buffer and summed per row by :func:`sum_tables` at the end, instead of
    being added into the rows chunk by chunk: on rows past the cache a random read costs about a
    third of ``index_add_``'s random read-modify-write."""
    b = block_size
    width = va.shape[1] if width is None else width
    bq_all, bk_all = iq.reshape(-1, b), ik.reshape(-1, b)  # every (group, table, block)
    reuse = keep is None and not is_tracing()  # (a compiled graph allocates its own buffers)
    bufs = _ChunkBuffers(qa, ka, va, min(chunk_blocks, bq_all.shape[0]), b) if reuse else None
    if workspace is not None and reuse:
        results = workspace.results(bq_all.numel())  # (G·T·n, dv') in block layout
        for s in range(0, bq_all.shape[0], chunk_blocks):
            bq, bk = bq_all[s:s + chunk_blocks], bk_all[s:s + chunk_blocks]
            bufs.chunk(qa, ka, va, bq, bk, out=results[s * b:(s + bq.shape[0]) * b].view(bq.shape[0], b, -1))
        acc = sum_tables(results, table_positions(iq), out=workspace.acc, tmp=workspace.tmp)
        den = acc[:, width - 1] + iq.shape[1] * DENOM_EPS
        return torch.div(acc[:, :width - 1], den[:, None], out=out), den
    acc = va.new_zeros(va.shape)  # [Σ_t numerator, Σ_t denominator, padding] per row
    one_chunk = bq_all.shape[0] <= chunk_blocks and not is_tracing()
    for s in range(0, bq_all.shape[0], chunk_blocks):
        bq, bk = bq_all[s:s + chunk_blocks], bk_all[s:s + chunk_blocks]
        if bufs is None:
            logits = _chunk_logits(_rows(qa, bq), _rows(ka, bk))
            above = _clamped(logits) if keep is not None else None  # before the in-place exp below
            scores = _chunk_scores(logits)
            if keep is not None:
                keep.append((above, scores))
            res = torch.bmm(scores, _rows(va, bk))
        else:
            res = bufs.chunk(qa, ka, va, bq, bk)
        if one_chunk:
            acc = sum_tables(res.flatten(0, 1), table_positions(iq))
        else:
            acc.index_add_(0, bq.reshape(-1), res.flatten(0, 1))
    den = acc[:, width - 1] + iq.shape[1] * DENOM_EPS
    return torch.div(acc[:, :width - 1], den[:, None], out=out), den


def table_positions(order: torch.Tensor) -> torch.Tensor:
    """For sort orders ``order`` (G, T, n) of row numbers (each table's orders together a permutation
    of the G·n rows), the position of each row in the flattened (G, T, n) block layout, per table:
    (T, G·n) int64 with ``pos[t, order[g, t, j]] = (g·T + t)·n + j``."""
    G, T, n = order.shape
    pos = torch.arange(G * T * n, device=order.device).view(G, T, n).transpose(0, 1).reshape(T, G * n)
    return torch.empty_like(pos).scatter_(1, order.transpose(0, 1).reshape(T, G * n), pos)


def sum_tables(res: torch.Tensor, pos: torch.Tensor, out: torch.Tensor | None = None,
               tmp: torch.Tensor | None = None) -> torch.Tensor:
    """Σ over tables of per-table results in block layout: res (G·T·n, w) rows in the order of the
    sort orders, pos from :func:`table_positions` -> (G·n, w) in row order. The same sums as
    ``index_add_`` of every table's rows, as one row gather and a sum: ``index_add_`` on the CPU
    scatters element by element and gets slower with a second thread, and the one-chunk heads of a
    training step on small clouds spent 10 % of the step in it. With ``out`` and ``tmp`` (buffers
    of the result's shape) the tables are gathered one at a time into ``tmp`` and added into
    ``out`` in table order (the same sums, no T-fold temporary)."""
    T, R = pos.shape
    if out is None:
        return res.index_select(0, pos.reshape(-1)).view(T, R, -1).sum(0)
    torch.index_select(res, 0, pos[0], out=out)
    for t in range(1, T):
        out.add_(torch.index_select(res, 0, pos[t], out=tmp))
    return out


def joint_rows(ka: torch.Tensor, va: torch.Tensor) -> torch.Tensor | None:
    """The (P, wk + wv) matrix whose first columns are ka (P, wk) and whose last are va (P, wv), when
    both are such column blocks of one matrix (:func:`head_rows` with ``joint_kv``), else None."""
    if (ka.dim() != 2 or ka.shape[0] != va.shape[0] or ka.stride() != va.stride() or ka.stride(1) != 1
            or va.data_ptr() != ka.data_ptr() + ka.shape[1] * ka.element_size()
            or ka.stride(0) != ka.shape[1] + va.shape[1]):
        return None
    return ka.as_strided((ka.shape[0], ka.stride(0)), ka.stride())


class _ChunkBuffers:
    """One chunk's gathered rows, logits/scores and products, allocated once per call of
    :func:`_attend` and reused by every chunk (``out=`` forms): fresh allocations of these sizes
    cost page faults on every chunk, and the buffers stay in cache between chunks. Key and value
    rows that are column blocks of one matrix (:func:`joint_rows`) are gathered by one
    ``index_select`` of the joint rows: one random access per row instead of two (a third less
    time for the gathers of a million rows, docs/benchmarks.md)."""

    def __init__(self, qa, ka, va, chunk_blocks: int, b: int):
        self.Q = qa.new_empty(chunk_blocks, b, qa.shape[1])
        self.kv = joint_rows(ka, va)
        if self.kv is not None:
            self.KV = ka.new_empty(chunk_blocks, b, self.kv.shape[1])
            self.K, self.V = self.KV[..., :ka.shape[1]], self.KV[..., ka.shape[1]:]
        else:
            self.K = ka.new_empty(chunk_blocks, b, ka.shape[1])
            self.V = va.new_empty(chunk_blocks, b, va.shape[1])
        self.L = qa.new_empty(chunk_blocks, b, b)
        self.R = va.new_empty(chunk_blocks, b, va.shape[1])

    def chunk(self, qa, ka, va, bq, bk, out: torch.Tensor | None = None) -> torch.Tensor:
        """Σ-ready rows exp(chunk logits) @ V' of the chunk of blocks (bq, bk) (c, b) ×2 -> (c, b, dv'),
        written into ``out`` if given, else into this object's buffer."""
        c = bq.shape[0]
        Q, K, V, L = self.Q[:c], self.K[:c], self.V[:c], self.L[:c]
        R = self.R[:c] if out is None else out
        torch.index_select(qa, 0, bq.reshape(-1), out=Q.view(-1, Q.shape[-1]))
        if self.kv is not None:
            torch.index_select(self.kv, 0, bk.reshape(-1), out=self.KV[:c].view(-1, self.kv.shape[1]))
        else:
            torch.index_select(ka, 0, bk.reshape(-1), out=K.view(-1, K.shape[-1]))
            torch.index_select(va, 0, bk.reshape(-1), out=V.view(-1, V.shape[-1]))
        return torch.bmm(_chunk_scores(_chunk_logits(Q, K, out=L)), V, out=R)


def _attend_backward(qa, ka, va, iq, ik, out, den, grad_out, block_size: int, chunk_blocks: int,
                     stored: list | None = None):
    """Backward loop with recomputed scores (or the forward's, ``stored`` by :func:`_attend`'s
    ``keep``: the same numbers). Returns dqa, dka, dva, where dqa / dka are the total
    derivatives w.r.t. q̂ / k̂ in their first D columns (the norm columns' chain rule folded in,
    the two folded columns zeroed) and padded keys get no gradient. ``out`` (R, dv): with
    zero-padded value rows va (R, dv' > dv + 1), dva's padding columns come back 0."""
    b = block_size
    bq_all, bk_all = iq.reshape(-1, b), ik.reshape(-1, b)
    # out = N / Dn  =>  dN = g / Dn,  dDn = −Σ_c g·out / Dn
    dacc = torch.cat([grad_out / den[:, None], (-(grad_out * out).sum(-1) / den)[:, None]], 1)
    if dacc.shape[1] < va.shape[1]:  # zero-padded value rows (value_width): their gradient columns are 0
        dacc = torch.cat([dacc, dacc.new_zeros(dacc.shape[0], va.shape[1] - dacc.shape[1])], 1)
    one_chunk = bq_all.shape[0] <= chunk_blocks and not is_tracing()  # sums by gathers, see sum_tables
    if one_chunk:
        pos_q, pos_k = table_positions(iq), table_positions(ik)
    else:
        dqa, dka, dva = torch.zeros_like(qa), torch.zeros_like(ka), torch.zeros_like(va)
    for i, s in enumerate(range(0, bq_all.shape[0], chunk_blocks)):
        bq, bk = bq_all[s:s + chunk_blocks], bk_all[s:s + chunk_blocks]
        fq, fk = bq.reshape(-1), bk.reshape(-1)
        Q, K, V = _rows(qa, bq), _rows(ka, bk), _rows(va, bk)
        if stored is not None:
            above, scores = stored[i]
        else:
            logits = _chunk_logits(Q, K)
            above = _clamped(logits)
            scores = _chunk_scores(logits)  # in place: logits are not needed again
        dNV = _rows(dacc, bq)
        gv = torch.bmm(scores.transpose(1, 2), dNV).flatten(0, 1)
        dlog = torch.bmm(dNV, V.transpose(1, 2)).mul_(scores)
        if above is not None:
            dlog.masked_fill_(above, 0.0)
        gq = torch.bmm(dlog, K).flatten(0, 1)
        gk = torch.bmm(dlog.transpose(1, 2), Q).flatten(0, 1)
        if one_chunk:
            dqa, dka, dva = sum_tables(gq, pos_q), sum_tables(gk, pos_k), sum_tables(gv, pos_k)
        else:
            dva.index_add_(0, fk, gv)
            dqa.index_add_(0, fq, gq)
            dka.index_add_(0, fk, gk)
    D = qa.shape[1] - 2
    dqa[:, :D].addcmul_(dqa[:, D:D + 1], qa[:, :D], value=-1.0)  # ∂(−½‖x‖²)/∂x = −x
    dka[:, :D].addcmul_(dka[:, D + 1:D + 2], ka[:, :D], value=-1.0)
    dqa[:, D:].zero_()
    dka[:, D:].zero_()
    keep = va[:, out.shape[1]:out.shape[1] + 1]  # the ones column: 0 for padded keys
    dka.mul_(keep)
    dva.mul_(keep)
    return dqa, dka, dva


class _SortedBlockAttention(torch.autograd.Function):
    """On prebuilt augmented rows; saves them for the backward pass."""

    @staticmethod
    def forward(ctx, qa, ka, va, iq, ik, block_size, chunk_blocks):
        out, den = _attend(qa, ka, va, iq, ik, block_size, chunk_blocks)
        ctx.save_for_backward(qa, ka, va, iq, ik, out, den)
        ctx.block_size, ctx.chunk_blocks = block_size, chunk_blocks
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        grads = _attend_backward(*ctx.saved_tensors, grad_out, ctx.block_size, ctx.chunk_blocks)
        return (*grads, None, None, None, None)


def value_width(width: int) -> int:
    """Columns of the value rows [v, 1] as the fused CPU path stores them: ``width`` = dv + 1 rounded
    up to a multiple of 8, the padding zero. MKL's batched GEMM and ``index_select`` have fast paths
    for rows of whole 32-byte vectors: at HEPT's dv + 1 = 25 + 1 the block products S·V' and the
    gathers of V' take about 3/4 and 1/2 of their time at 26 columns (docs/benchmarks.md, "Notes on
    HEPT's CPU kernels")."""
    return -(-width // 8) * 8


def padded_value_weights(wv: torch.Tensor, heads: int) -> torch.Tensor:
    """Every head's value weights with zero rows appended up to :func:`value_width`:
    (H·(dv+1), Din) -> (H, value_width(dv+1), Din)."""
    w = wv.view(heads, -1, wv.shape[1])
    pad = value_width(w.shape[1]) - w.shape[1]
    return torch.cat([w, w.new_zeros(heads, pad, w.shape[2])], 1) if pad else w


def head_rows(xp: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, heads: int, h: int,
              workspace: "HeadWorkspace | None" = None, joint_kv: bool = False):
    """Head ``h``'s rows qa, ka (P, D+2) and va (P, :func:`value_width` (dv+1)) = xp @ w_hᵀ, with the
    norm columns filled and va's padding columns zero; written into ``workspace``'s buffers if given
    (which implies ``joint_kv``). ``joint_kv``: ka and va are the column blocks of one (P, D+2+dv')
    matrix from one GEMM (see :func:`joint_rows`), else two matrices.

    xp: (P, Din); wq, wk: (H·(D+2), Din); wv: (H·(dv+1), Din), heads stacked h-major.
    """
    Din = xp.shape[1]
    w = (wq.view(heads, -1, Din)[h], wk.view(heads, -1, Din)[h], padded_value_weights(wv, heads)[h])
    wk_cols = w[1].shape[0]
    if workspace is not None:
        qa, kv = (torch.mm(xp, wh.T, out=buf) for wh, buf in zip((w[0], torch.cat(w[1:])), workspace.rows))
        ka, va = kv[:, :wk_cols], kv[:, wk_cols:]
    elif joint_kv:  # narrow GEMMs (K = Din ≈ 32) through oneDNN for long inputs (fast_linear.matmul)
        qa, kv = fast_linear.matmul(xp, w[0].T), fast_linear.matmul(xp, torch.cat(w[1:]).T)
        ka, va = kv[:, :wk_cols], kv[:, wk_cols:]
    else:
        qa, ka, va = (fast_linear.matmul(xp, wh.T) for wh in w)
    fill_norm_columns(qa, ka)
    return qa, ka, va


#: Fewest rows (points of all clouds, padded) for which the per-head CPU inference path keeps one
#: :class:`HeadWorkspace` per worker for all heads of a layer. A buffer of P × 32 floats is past
#: glibc's largest mmap threshold (32 MB) from P = 262144 on: each fresh one is mapped anew and
#: page-faulted in by its first write, and four of them per head cost about a tenth of a 1M-point
#: forward (docs/benchmarks.md, "Notes on HEPT's CPU kernels"). Below it freed buffers are reused
#: by the allocator anyway, and the rows keep oneDNN's GEMM (:func:`fast_linear.matmul`).
WORKSPACE_MIN_ROWS = 1 << 18


class HeadWorkspace:
    """One worker's buffers for a head of the per-head path, reused head after head: the rows qa
    (P, D+2) and [ka, va] (P, D+2+dv'), filled by :func:`head_rows`; for :func:`_attend`, every table's chunk
    results in block layout (:meth:`results`) and the per-row sums ``acc`` with a temporary ``tmp``
    (P, dv') each."""

    def __init__(self, xp: torch.Tensor, qk_width: int, v_width: int):
        P = xp.shape[0]
        self.rows = (xp.new_empty(P, qk_width), xp.new_empty(P, qk_width + v_width))  # qa, [ka, va]
        self.acc, self.tmp = xp.new_empty(P, v_width), xp.new_empty(P, v_width)
        self._results = xp.new_empty(0, v_width)
        self._out: torch.Tensor | None = None

    def out(self, dv: int) -> torch.Tensor:
        """A (P, dv) buffer for one head's output (the fused output projection's input)."""
        if self._out is None or self._out.shape[1] != dv:
            self._out = self.acc.new_empty(self.acc.shape[0], dv)
        return self._out

    def results(self, n: int) -> torch.Tensor:
        """A (n, dv') buffer for n result rows (all tables' sorted rows), kept for the next head."""
        if self._results.shape[0] != n:
            self._results = self._results.new_empty(n, self._results.shape[1])
        return self._results


#: Run the heads of the per-head CPU inference path in parallel Python threads (see
#: :func:`run_heads`); False: one after another, every kernel split across torch's threads.
PARALLEL_HEADS = True

#: Fewest rows (points of all clouds, padded) for which :func:`head_workers` runs heads in
#: parallel: below it a head's kernels are short and the threads mostly wait for each other on
#: Python's interpreter lock (measured in docs/benchmarks.md, "Notes on HEPT's CPU kernels").
PARALLEL_MIN_ROWS = 4096

#: Most rows for which :func:`head_workers` runs heads in parallel: past it a head's rows no longer
#: fit in the last-level cache, every block's rows come from memory, and two heads at once only
#: compete for it while each holds its own rows (about 0.7 GB per head at 1M points). Published
#: model, 2 threads, one cold forward: 250k points 7.0 s in parallel against 9.7 s one head after
#: another, 500k 18.0 against 16.0 s (peak growth 2.9 against 1.4 GB), 1M 41.7 against 38.2 s
#: (4.3 against 2.6 GB).
PARALLEL_MAX_ROWS = 300_000


def head_workers(heads: int, xp: torch.Tensor, training: bool) -> int:
    """Threads :func:`run_heads` uses for the rows ``xp`` (P, ·): torch's intra-op thread count (at
    most one per head) in CPU inference of :data:`PARALLEL_MIN_ROWS` to :data:`PARALLEL_MAX_ROWS`
    rows when :data:`PARALLEL_HEADS`; otherwise 1 (one head after another). Training keeps one after
    another: its backward pass would need a gradient accumulator per thread, and at the sizes
    it runs its kernels are short."""
    if (not PARALLEL_HEADS or training or xp.device.type != "cpu" or is_tracing()
            or not PARALLEL_MIN_ROWS <= xp.shape[0] <= PARALLEL_MAX_ROWS):
        return 1
    return max(1, min(torch.get_num_threads(), heads))


def run_heads(fn, heads: int, workers: int) -> None:
    """``fn(h, w)`` for every head h, by worker w of ``workers``: worker w takes heads w, w + workers, …
    in order (a fixed assignment, so anything a worker accumulates is reproducible).

    With more than one worker the workers are Python threads and every kernel runs on one
    intra-op thread (torch's thread count is set to 1 meanwhile and restored after): the heads
    are independent, each small kernel keeps its data in its core's cache, and no kernel pays
    for splitting a few hundred microseconds of work across threads. A kernel's result then
    equals a one-thread run's (elementwise kernels round the tail of each thread's share through
    a scalar path, so results can differ by float rounding between thread counts otherwise).
    """
    if workers <= 1:
        for h in range(heads):
            fn(h, 0)
        return
    from concurrent.futures import ThreadPoolExecutor

    grad = torch.is_grad_enabled()  # thread-local: a new thread starts with autograd on

    def worker(w: int) -> None:
        with torch.set_grad_enabled(grad):
            for h in range(w, heads, workers):
                fn(h, w)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers) as pool:
            for f in [pool.submit(worker, w) for w in range(workers)]:
                f.result()  # re-raises a worker's exception here
    finally:
        torch.set_num_threads(threads)


#: Largest training layer (rows × all heads' q', k', v' columns, in floats) whose rows are projected
#: for all heads by one GEMM and kept for the backward pass, instead of three GEMMs per head in the
#: forward and again in the backward; the backward's input and weight gradients are then one GEMM
#: each. 2^23 floats (32 MB) hold about 10k points at HEPT's widths (8 heads × 96 columns); a
#: training step on the demo's clouds runs 2 GEMMs per layer and direction instead of 24-48.
KEEP_ROWS_MAX = 1 << 23


def all_head_rows(xp: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, heads: int):
    """Every head's rows from one GEMM: qa (H, P, D+2), ka (H, P, D+2), va (H, P, :func:`value_width`
    (dv+1)), each head's rows contiguous, norm columns filled, va's padding zero (what
    :func:`head_rows` gives head by head), and the stacked weight W (H·(2(D+2) + dv'), Din) with
    rows = xp Wᵀ (for the backward pass, :func:`all_head_grads`)."""
    P, Din = xp.shape
    wv_h = padded_value_weights(wv, heads)
    w = torch.cat([wq, wk, wv_h.reshape(-1, Din)])
    rows = xp @ w.T
    qa, ka, va = (r.view(P, heads, -1).transpose(0, 1).contiguous()
                  for r in rows.split([wq.shape[0], wk.shape[0], wv_h.shape[0] * wv_h.shape[1]], 1))
    fill_norm_columns(qa, ka)
    return qa, ka, va, w


def all_head_grads(xp: torch.Tensor, w: torch.Tensor, dqa: torch.Tensor, dka: torch.Tensor, dva: torch.Tensor,
                   dv1: int):
    """Gradients of xp and of wq, wk, wv from the rows' gradients (H, P, ·) ×3 of :func:`all_head_rows`
    (va's padding columns dropped: ``dv1`` = dv + 1 of them are weights). Returns dxp, dwq, dwk, dwv."""
    H, P = dqa.shape[:2]
    drows = torch.cat([g.transpose(0, 1).reshape(P, -1) for g in (dqa, dka, dva)], 1)  # (P, rows' columns)
    dw = drows.T @ xp
    nq, nk = dqa.shape[0] * dqa.shape[2], dka.shape[0] * dka.shape[2]
    dwv = dw[nq + nk:].view(H, dva.shape[2], -1)[:, :dv1].reshape(H * dv1, -1)
    return drows @ w, dw[:nq], dw[nq:nq + nk], dwv


class _ProjectedSortedBlockAttention(torch.autograd.Function):
    """Rows are linear projections of a narrow input, built and attended one head at a time.

    Why per head: a head's rows (P × 32 floats, 7.7 MB at 60k points) stay in the last-level
    cache through its gathers and ``index_add_``, and no temporary is larger than one head's
    rows, so large clouds do not pay the page faults of fresh 50-100 MB allocations per layer
    (docs/benchmarks.md, "Notes from measurements"). Only xp, the weights and the sort
    orders are saved; the backward pass recomputes each head's rows (a few cheap GEMMs), so a
    layer keeps less than full attention keeps (q, k, v and the output). Small training layers
    (:data:`KEEP_ROWS_MAX`) project all heads' rows at once and keep them, and small clouds keep
    their block scores too (:data:`STORE_SCORES_MAX`): there the per-kernel cost of many small
    GEMMs, not memory, is what limits a training step. Inference on at least
    :data:`WORKSPACE_MIN_ROWS` rows reuses one :class:`HeadWorkspace` per worker for every head,
    and may apply the output projection head by head (``out_proj``).
    """

    @staticmethod
    def forward(ctx, xp, wq, wk, wv, heads, sort_head, block_size, chunk_blocks, out_proj=None):
        P = xp.shape[0]
        dv = wv.shape[0] // heads - 1
        keep = any(ctx.needs_input_grad[:4])  # training: the backward pass needs the sort orders
        workers = head_workers(heads, xp, keep)
        spaces = ([HeadWorkspace(xp, wq.shape[0] // heads, value_width(dv + 1)) for _ in range(workers)]
                  if not keep and not is_tracing() and P >= WORKSPACE_MIN_ROWS else [None] * workers)
        if out_proj is not None and spaces[0] is None:
            raise ValueError("out_proj needs the workspace path (inference on at least WORKSPACE_MIN_ROWS rows)")
        if out_proj is None:
            out = xp.new_empty(P, heads, dv)
        else:  # each head's output into its worker's buffer, projected and summed per worker
            weight = out_proj[0].view(out_proj[0].shape[0], heads, dv)
            sums = [xp.new_zeros(P, weight.shape[0]) for _ in range(workers)]
        den = xp.new_empty(P, heads)
        orders: list = [None] * heads
        scores: list = [None] * heads  # per head: its chunks' (clamp mask, scores), small clouds only
        width = wq.shape[0] + wk.shape[0] + heads * value_width(dv + 1)
        rows = (all_head_rows(xp, wq, wk, wv, heads)
                if keep and not is_tracing() and P * width <= KEEP_ROWS_MAX else None)

        def head(h: int, worker: int) -> None:
            ws = spaces[worker]
            qa, ka, va = head_rows(xp, wq, wk, wv, heads, h, ws, joint_kv=not keep) if rows is None else (r[h] for r in rows[:3])
            iq, ik = sort_head(qa, ka, h)
            store = keep and not is_tracing() and P * heads * iq.shape[1] * block_size <= STORE_SCORES_MAX
            kept = [] if store else None
            if is_tracing():  # torch.compile refuses a non-contiguous out=
                out[:, h], den[:, h] = _attend(qa, ka, va, iq, ik, block_size, chunk_blocks, width=dv + 1)
            elif out_proj is not None:
                o, den[:, h] = _attend(qa, ka, va, iq, ik, block_size, chunk_blocks, out=ws.out(dv), width=dv + 1,
                                       workspace=ws)
                sums[worker].addmm_(o, weight[:, h].T)
            else:
                _, den[:, h] = _attend(qa, ka, va, iq, ik, block_size, chunk_blocks, out=out[:, h], keep=kept,
                                       width=dv + 1, workspace=ws)
            if keep:
                orders[h] = torch.stack([iq, ik])
                scores[h] = kept

        run_heads(head, heads, workers)
        if out_proj is not None:  # Σ_h o_h W_hᵀ, worker sums in worker order, then the bias
            y = sums[0]
            for extra in sums[1:]:
                y += extra
            return y if out_proj[1] is None else y.add_(out_proj[1])
        if keep:
            ctx.save_for_backward(xp, wq, wk, wv, torch.stack(orders), out, den)
            ctx.heads, ctx.block_size, ctx.chunk_blocks = heads, block_size, chunk_blocks
            ctx.scores, ctx.rows = scores, rows
        return out.view(P, heads * dv)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        xp, wq, wk, wv, orders, out, den = ctx.saved_tensors
        H = ctx.heads
        P = xp.shape[0]
        grad_out = grad_out.reshape(P, H, -1)
        # the forward's scores serve the first backward pass and are freed as it goes (a second one,
        # with retain_graph, recomputes them)
        stored, ctx.scores = ctx.scores or [None] * H, None
        rows = ctx.rows
        if rows is not None:  # all heads' rows kept: their gradients per head, then one GEMM each for dxp and dw
            grads = [torch.empty_like(r) for r in rows[:3]]
            for h in range(H):
                for g, gh in zip(grads, _attend_backward(
                        rows[0][h], rows[1][h], rows[2][h], orders[h, 0], orders[h, 1], out[:, h], den[:, h],
                        grad_out[:, h], ctx.block_size, ctx.chunk_blocks, stored[h])):
                    g[h] = gh
                stored[h] = None
            return *all_head_grads(xp, rows[3], *grads, wv.shape[0] // H), None, None, None, None, None
        dxp = torch.zeros_like(xp)
        dw = [torch.zeros_like(w).view(H, -1, xp.shape[1]) for w in (wq, wk, wv)]
        for h in range(H):
            qa, ka, va = head_rows(xp, wq, wk, wv, H, h)
            grads = _attend_backward(qa, ka, va, orders[h, 0], orders[h, 1], out[:, h], den[:, h], grad_out[:, h],
                                     ctx.block_size, ctx.chunk_blocks, stored[h])
            stored[h] = None
            for g, w, dw_all in zip(grads, (wq, wk, wv), dw):
                g = g[:, :dw_all.shape[1]]  # without va's zero padding
                dxp.addmm_(g, w.view(H, -1, xp.shape[1])[h])
                dw_all[h] = g.T @ xp
        return dxp, *(d.view(-1, xp.shape[1]) for d in dw), None, None, None, None, None


def sorted_block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_valid: torch.Tensor,
    iq: torch.Tensor,
    ik: torch.Tensor,
    block_size: int,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
) -> torch.Tensor:
    """Σ_t A⁽ᵗ⁾V / (Σ_t A⁽ᵗ⁾1 + T·1e−20) with block-diagonal A⁽ᵗ⁾ in each table's sorted order,
    A_uv = exp(min(0, −½‖q_u − k_v‖²)).

    Args:
        q, k: (R, D) query / key rows (HEPT: the coordinate-augmented q̂, k̂).
        v: (R, dv) value rows.
        key_valid: (R,) bool, False for padded keys (kernel value exactly 0).
        iq, ik: (G, T, n) int64 row numbers: for group g (cloud × head) and table t, the rows of
            g's n points in the table's query / key sort order (each a permutation of g's rows;
            every row belongs to exactly one group, so R = G·n). n must be a multiple of b.
        block_size: b.
        chunk_elems: score entries computed at once (a speed/memory knob, not semantics).
    Returns:
        (R, dv) attention output per row.
    """
    if iq.shape != ik.shape or iq.dim() != 3:
        raise ValueError(f"iq/ik must both have shape (G, T, n), got {tuple(iq.shape)} and {tuple(ik.shape)}")
    G, T, n = iq.shape
    if n % block_size:
        raise ValueError(f"point count {n} must be a multiple of block_size={block_size} (pad first)")
    if q.shape[0] != G * n or k.shape != q.shape or v.shape[0] != G * n or key_valid.shape != (G * n,):
        raise ValueError(f"q/k/v/key_valid must have G·n = {G * n} rows and q, k the same shape; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, {tuple(key_valid.shape)}")
    qa, ka, va = augment_rows(q, k, v, key_valid)
    out = sorted_block_attention_rows(qa, ka, va, iq, ik, block_size, chunk_elems)
    return out


def sorted_block_attention_rows(qa: torch.Tensor, ka: torch.Tensor, va: torch.Tensor, iq: torch.Tensor,
                                ik: torch.Tensor, block_size: int,
                                chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> torch.Tensor:
    """:func:`sorted_block_attention` on prebuilt augmented rows (see :func:`augment_rows`).

    qa, ka: (R, D+2) with norm columns filled by :func:`fill_norm_columns`; va: (R, dv+1) with
    last column 1 for real keys and all-zero rows for padded keys. Returns (R, dv).
    The gradient returned for qa / ka is the total derivative w.r.t. their first D columns.
    """
    chunk_blocks = chunk_blocks_for(chunk_elems, block_size, qa)
    return _SortedBlockAttention.apply(qa, ka, va, iq, ik, block_size, chunk_blocks)


def static_block_sums(qa: torch.Tensor, ka: torch.Tensor, va: torch.Tensor, iq: torch.Tensor, ik: torch.Tensor,
                      block_size: int, group_chunk: int | None = DEFAULT_GROUP_CHUNK) -> torch.Tensor:
    """Σ_t A⁽ᵗ⁾V' in point order with a graph whose shapes are static in n: the export path of
    the block attention (the same sums as :func:`_attend`, without its data-dependent chunk loop,
    ``index_add_`` and custom autograd).

    Each group's sort order (length n, any n) is extended by ``2b`` indices of an all-zero dummy
    row and cut into ``n // b + 2`` blocks by index arithmetic, so real points fall in the same
    blocks as in the padded layout of the training path (block j = sorted positions jb … jb+b−1)
    and the dummy keys, whose value rows are 0, add nothing, as padded keys do. Results go back to
    point order by a gather with the inverse permutation. ``n // b + 2`` blocks (always ≥ 2) spare
    the exporter a size-1 special case; trailing all-dummy blocks cost one block of work per group.

    Args:
        qa, ka: (G, n, D+2) augmented rows per group (cloud × head), norm columns filled;
            va: (G, n, dv+1) value rows [v, 1], all zero for padded keys.
        iq, ik: (G, T, n) int64 per-table sort orders (local indices 0 … n−1).
        block_size: b. group_chunk: groups per chunk (a static Python loop; None = all at once).
    Returns:
        (G, n, dv+1): Σ_t numerators (first dv columns) and denominators (last column), without
        the per-table guard.
    """
    G, N, Dq = qa.shape
    Dv = va.shape[-1]
    T = iq.shape[1]
    b = block_size
    dev = qa.device
    nb = N // b + 2
    blk = (torch.arange(nb, device=dev) * b).unsqueeze(-1) + torch.arange(b, device=dev)  # (nb, b)
    ranks = torch.arange(N, device=dev)
    step = G if not group_chunk else min(group_chunk, G)
    outs = []
    for g0 in range(0, G, step):
        g1 = min(g0 + step, G)
        g = g1 - g0
        dummy = g * N  # index of the appended all-zero row
        rows_q = torch.cat([qa[g0:g1].reshape(g * N, Dq), qa.new_zeros(1, Dq)])
        rows_k = torch.cat([ka[g0:g1].reshape(g * N, Dq), ka.new_zeros(1, Dq)])
        rows_v = torch.cat([va[g0:g1].reshape(g * N, Dv), va.new_zeros(1, Dv)])
        base = (torch.arange(g, device=dev) * N).view(g, 1)
        pad = torch.full((g, 2 * b), dummy, dtype=torch.int64, device=dev)  # slots n … nb·b − 1
        slot_base = torch.arange(g, device=dev).view(g, 1) * (nb * b)
        acc = None
        for t in range(T):
            oq, ok = iq[g0:g1, t], ik[g0:g1, t]  # (g, n)
            sq = torch.cat([oq + base, pad], 1)[:, blk]  # (g, nb, b) rows in block order
            sk = torch.cat([ok + base, pad], 1)[:, blk]
            scores = torch.matmul(rows_q[sq], rows_k[sk].transpose(-1, -2)).clamp(logit_floor(qa.dtype), 0.0).exp()
            res = torch.matmul(scores, rows_v[sk]).flatten(0, 2)  # (g·nb·b, Dv) in block order
            # query i of group j sits at slot j·nb·b + rank_t(i)
            inv = torch.empty_like(oq).scatter(1, oq, ranks.expand(g, N))
            back = res[inv + slot_base]  # (g, n, Dv)
            acc = back if acc is None else acc + back
        outs.append(acc)
    return outs[0] if len(outs) == 1 else torch.cat(outs, 0)


def materialized_sorted_block_attention(xp: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
                                        heads: int, sort_heads, block_size: int) -> torch.Tensor:
    """The straightforward path, as the HEPT authors' code computes it: every block's score matrix
    of every table and head materialised at once, exponentiated, kept by autograd for the backward
    pass. The reference the fused path is tested against, and the baseline of its benchmark.

    Same arguments and result as :func:`projected_sorted_block_attention` (``sort_heads`` required;
    P a multiple of b).
    """
    P = xp.shape[0]
    rows = []
    for w in (wq, wk):
        r = torch.matmul(xp, w.T).view(P, heads, -1)
        D = r.shape[-1] - 2
        norm = -0.5 * r[..., :D].pow(2).sum(-1, keepdim=True)  # differentiable here: autograd does the chain rule
        r = torch.cat([r[..., :D], norm, r[..., D + 1:]], -1) if w is wq else torch.cat([r[..., :D + 1], norm], -1)
        rows.append(r.reshape(P * heads, -1))
    qa, ka = rows
    va = torch.matmul(xp, wv.T).view(P * heads, -1)
    with torch.no_grad():
        iq, ik = sort_heads(qa.view(P, heads, -1), ka.view(P, heads, -1))  # (G, T, n) row numbers into P·H rows
    G, T, n = iq.shape
    b = block_size
    Q = qa[iq].view(G, T, n // b, b, -1)
    K = ka[ik].view(G, T, n // b, b, -1)
    V = va[ik].view(G, T, n // b, b, -1)
    scores = torch.matmul(Q, K.transpose(-1, -2)).clamp(LOGIT_FLOOR, 0.0).exp()
    res = torch.matmul(scores, V).reshape(G * T * n, -1)  # sorted order: numerators and denominator
    acc = torch.zeros_like(va).index_add(0, iq.reshape(-1), res)  # Σ over tables, back in row order
    out = acc[:, :-1] / (acc[:, -1:] + T * DENOM_EPS)
    return out.view(P, -1)


def _static_projected(xp, wq, wk, wv, heads: int, sort_head, block_size: int, group_chunk) -> torch.Tensor:
    """The export path of :func:`projected_sorted_block_attention` (same arguments, same result)."""
    P = xp.shape[0]
    qa, ka, va = (torch.matmul(xp, w.T).view(P, heads, -1) for w in (wq, wk, wv))
    fill_norm_columns(qa, ka)
    iqs, iks = [], []
    with torch.no_grad():
        for h in range(heads):
            iq, ik = sort_head(qa[:, h], ka[:, h], h)  # (C, T, n) row numbers c·n + i into head h's rows
            base = (torch.arange(iq.shape[0], device=xp.device) * iq.shape[2]).view(-1, 1, 1)
            iqs.append(iq - base)
            iks.append(ik - base)
    C, T, n = iqs[0].shape

    def groups(r: torch.Tensor) -> torch.Tensor:  # (P, H, w) -> (H·C, n, w), group h·C + c
        return r.transpose(0, 1).reshape(heads * C, n, r.shape[-1])

    acc = static_block_sums(groups(qa), groups(ka), groups(va), torch.cat(iqs), torch.cat(iks), block_size,
                            group_chunk)
    out = acc[..., :-1] / (acc[..., -1:] + T * DENOM_EPS)  # (H·C, n, dv)
    return out.view(heads, P, -1).transpose(0, 1).reshape(P, -1)


def projected_sorted_block_attention(xp: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
                                     heads: int, sort_head, block_size: int,
                                     chunk_elems: int = DEFAULT_CHUNK_ELEMS, sort_heads=None,
                                     all_heads: bool | None = None, static: bool = False,
                                     group_chunk: int | None = DEFAULT_GROUP_CHUNK,
                                     out_proj: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
    """:func:`sorted_block_attention` whose rows are projections of a narrow input, one head at a
    time (memory-lean and cache-friendly, see :class:`_ProjectedSortedBlockAttention`).

    Args:
        xp: (P, Din) per-point inputs; wq, wk: (H·(D+2), Din) and wv: (H·(dv+1), Din) weights
            whose products are q' = [q̂, ·, 1], k' = [k̂, 1, ·] and v' = [v, 1] per head (the
            norm columns are filled here); padded points must have all-zero rows in xp.
        heads: H.
        sort_head: ``sort_head(qa, ka, h) -> (iq, ik)``, each (G, T, n) int64 row numbers into
            head h's P rows (G·n = P; see :func:`sorted_block_attention`); called without grad.
        sort_heads: optional ``sort_heads(qa, ka) -> (iq, ik)`` for all heads at once: qa, ka
            (P, H, D+2), orders (G·H, T, n) of row numbers p·H + h into the (P·H) rows.
        all_heads: project, sort and attend every head at once (needs ``sort_heads``) instead of
            one head at a time; ``None``: off the CPU. A GPU is launch-bound by the per-head loop
            (measurements in docs/benchmarks.md, "GPU notes"), while on the CPU one head's rows
            stay in cache. Same results either way (up to float rounding).
        static: the export path (:func:`static_block_sums`): no data-dependent loop, no custom
            autograd; P need not be a multiple of b (no padding needed); inference only.
        group_chunk: groups per chunk of the static path (None: all at once).
        out_proj: the output projection (weight (E, H·dv), bias (E,) or None), applied here: the
            result is then o Wᵀ + b. CPU inference on at least :data:`WORKSPACE_MIN_ROWS` rows
            projects each head's output as it is made and adds them up (Σ_h o_h W_hᵀ + b, equal to
            the projection of the concatenation up to float rounding), so the (P, H·dv) heads'
            outputs, 0.75 GB at a million points, are never held or written strided; other paths
            project the concatenation.
    Returns:
        (P, H·dv), heads concatenated h-major per point; (P, E) with ``out_proj``.
    """
    if all_heads is None:
        all_heads = sort_heads is not None and xp.device.type != "cpu"
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (xp, wq, wk, wv))
    if out_proj is not None and (static or all_heads or training or is_tracing() or xp.shape[0] < WORKSPACE_MIN_ROWS):
        o = projected_sorted_block_attention(xp, wq, wk, wv, heads, sort_head, block_size, chunk_elems,
                                             sort_heads, all_heads, static, group_chunk)
        return torch.nn.functional.linear(o, *out_proj)
    if static:
        return _static_projected(xp, wq, wk, wv, heads, sort_head, block_size, group_chunk)
    if all_heads:
        if sort_heads is None:
            raise ValueError("all_heads=True needs sort_heads")
        P = xp.shape[0]
        qa, ka, va = (xp @ w.T for w in (wq, wk, wv))
        qa, ka = qa.view(P, heads, -1), ka.view(P, heads, -1)
        fill_norm_columns(qa, ka)
        with torch.no_grad():
            iq, ik = sort_heads(qa, ka)
        out = sorted_block_attention_rows(qa.reshape(P * heads, -1), ka.reshape(P * heads, -1),
                                          va.reshape(P * heads, -1), iq, ik, block_size, chunk_elems)
        return out.view(P, -1)
    if training and chunk_elems == DEFAULT_CHUNK_ELEMS and xp.device.type == "cpu":
        chunk_elems = DEFAULT_CHUNK_ELEMS * TRAIN_CHUNK_FACTOR
    chunk_blocks = chunk_blocks_for(chunk_elems, block_size, xp)

    def checked_sort(qa, ka, h):
        with torch.no_grad():
            iq, ik = sort_head(qa, ka, h)
        if iq.shape != ik.shape or iq.dim() != 3 or iq.shape[0] * iq.shape[2] != qa.shape[0]:
            raise ValueError(f"sort_head must return two (G, T, n) orders with G·n = {qa.shape[0]}, got "
                             f"{tuple(iq.shape)} and {tuple(ik.shape)}")
        if iq.shape[2] % block_size:
            raise ValueError(f"point count {iq.shape[2]} must be a multiple of block_size={block_size} (pad first)")
        return iq, ik

    return _ProjectedSortedBlockAttention.apply(xp, wq, wk, wv, heads, checked_sort, block_size, chunk_blocks,
                                                out_proj)
