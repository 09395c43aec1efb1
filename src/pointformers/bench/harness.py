"""Shared benchmark machinery: isolated measurements, machine description, doc sections.

Each measurement runs in a fresh Python subprocess, so its peak resident memory is its own and
no allocator state leaks between mechanisms. The peak of a call is measured as: the process's
peak resident size is reset just before it (Linux ``clear_refs``), and the call's peak is
``ru_maxrss`` minus the resident size before the call, minus the growth of *file-backed*
resident pages during the call (shared-library code that the kernel had reclaimed and the call
faulted back in — on machines with proactive reclaim this alone is ~100 MB and is not the
call's working memory; the file-backed pages mapped before the call are also locked resident
with ``mlock`` where permitted, so they cannot be evicted and refaulted in the first place). Ratios are always taken between numbers measured
in the same run on the same machine.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch


def rss_bytes() -> int:
    """Current resident set size (Linux /proc; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_bytes()


def file_rss_bytes() -> int:
    """Resident file-backed pages (``RssFile`` of /proc/self/status; 0 where unavailable)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssFile:"))
    except (OSError, StopIteration, ValueError):
        return 0


def lock_resident_pages() -> bool:
    """``mlock`` every file-backed mapping (library code and data): keep those pages resident, so
    proactive reclaim cannot evict them and the measured call cannot fault them back in (which
    would count as its memory). Not ``mlockall``: that also faults in the heap's free pages, which
    the allocator handed back but keeps mapped, and the call would then reuse them without any
    growth of the resident size (a 64 MB call read 0 MB). Returns False where not permitted (then
    the file-page correction still applies)."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        ok = True
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) < 6 or not parts[5].startswith("/") or "r" not in parts[1]:
                    continue  # anonymous memory (heap, stacks, tensors) and unreadable guards stay as they are
                lo, hi = (int(a, 16) for a in parts[0].split("-"))
                ok &= libc.mlock(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo)) == 0
        return ok
    except (OSError, AttributeError, ValueError):
        return False


def release_free_memory() -> bool:
    """glibc ``malloc_trim(0)``: hand the allocator's free pages back to the kernel, so a call
    measured next cannot reuse memory that earlier work in this process freed but kept resident
    (its allocations would then add nothing to the resident size: a second measurement in one
    process read 0 MB for a 64 MB call without this). False where there is no glibc."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def reset_peak_rss() -> bool:
    """Reset the process's peak resident size to its current size (Linux ``clear_refs`` 5), so
    the next ``ru_maxrss`` is the measured call's own peak and not an earlier one (importing
    torch, building inputs). Returns False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    """Peak resident bytes of this process's memory map since :func:`reset_peak_rss`.

    Linux: ``VmHWM`` of /proc/self/status, the map's own high-water mark. Not ``ru_maxrss``:
    the kernel folds the parent's resident size at fork into an exec'ed child's ``ru_maxrss``,
    so a worker started by a large process (e.g. one that trained models) would report the
    parent's size, and ``clear_refs`` does not reset that part."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def measure(step: Callable[[], None], repeats: int) -> dict:
    """Median seconds over ``repeats`` calls and the first call's peak MB above the RSS before it
    (see the module doc: free heap pages released and the peak reset first, refaulted file pages not
    counted)."""
    release_free_memory()
    lock_resident_pages()
    reset_peak_rss()
    before, before_file = rss_bytes(), file_rss_bytes()
    t0 = time.perf_counter()
    step()
    times = [time.perf_counter() - t0]
    peak = peak_bytes() - before - max(0, file_rss_bytes() - before_file)
    times += _call_seconds(step, repeats - 1)
    return {"seconds": statistics.median(times), "runs": len(times), "peak_mb": peak / 2**20}


def _call_seconds(step: Callable[[], None], calls: int) -> list[float]:
    """Wall seconds of each of ``calls`` calls of ``step``."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def tensor_peak_bytes(step: Callable[[], None]) -> int:
    """Run ``step`` once under the torch profiler and return the peak of the bytes that torch's CPU
    allocator had handed out during it, above what was allocated before it.

    Unlike the resident-size peak this does not depend on the C allocator (glibc reuses freed
    heap memory on a second call, so a warm call's RSS growth can read near zero, while large
    blocks are always fresh mappings); it counts tensor memory only (not numpy scratch arrays
    or a kernel library's private buffers). It is the CPU analogue of
    ``torch.cuda.max_memory_allocated``.
    """
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.remove(path)
    totals = [e["args"]["Total Allocated"] for e in events
              if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0
              and "Total Allocated" in e.get("args", {})]
    return max([0, *totals])


def measure_warm(step: Callable[[], None], repeats: int) -> dict:
    """A first call that warms up (lazy initialisation, allocator, kernel selection) and gives the
    peak tensor memory (:func:`tensor_peak_bytes`), then the median seconds of ``repeats`` calls."""
    peak = tensor_peak_bytes(step)
    times = _call_seconds(step, repeats)
    return {"seconds": statistics.median(times), "runs": len(times), "peak_mb": peak / 2**20}


def run_isolated(module: str, args: list[str], timeout: float, tag: dict) -> dict:
    """Run ``python -m module --worker args…`` and parse the JSON on its last stdout line."""
    cmd = [sys.executable, "-m", module, "--worker", *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
        return {**tag, **json.loads(out.stdout.strip().splitlines()[-1])}
    except subprocess.TimeoutExpired:
        return {**tag, "error": f"timeout after {timeout:.0f} s"}
    except subprocess.CalledProcessError as e:
        return {**tag, "error": " ".join((e.stderr or "").strip().splitlines()[-1:])[:200]}


def front(results: list[dict], method: str, metric: str) -> list[dict]:
    """Pareto front of result rows (``{"method", "flops", metric, ...}``): the rows of ``method``
    sorted by FLOPs whose ``metric`` (an error) beats every cheaper row's."""
    pts = sorted((r for r in results if r["method"] == method and math.isfinite(r[metric])),
                 key=lambda r: (r["flops"], r[metric]))
    best, keep = math.inf, []
    for r in pts:
        if r[metric] < best:
            keep.append(r)
            best = r[metric]
    return keep


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (f"{cpu}, {os.cpu_count()} logical cores{gpu}, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), Python {platform.python_version()}")


def recorded_command(module: str, argv, hide=None) -> str:
    """The command line as a document records it: ``python -m module argv…`` with the values of the
    options in ``hide`` (option -> placeholder, e.g. ``{"--out": "RUNS"}``) replaced, so no local
    path (a scratch folder, the user's copy of real data) is written into the repository."""
    import shlex

    hide = {"--out": "RUNS", **(hide or {})}
    out, it = [], iter(list(argv))
    for tok in it:
        key = tok.split("=", 1)[0]
        if key in hide:
            out += [key, hide[key]]
            if "=" not in tok:
                next(it, None)
        else:
            out.append(tok)
    return " ".join(["python", "-m", module] + [shlex.quote(t) for t in out])


def run_config_record(cfg) -> dict:
    """The sections of a resolved config that decide a run's result (model, data, task, train),
    JSON-normalised (tuples as lists), as a results file records them beside the run's row."""
    import json

    return json.loads(json.dumps({k: cfg[k] for k in ("model", "data", "task", "train") if k in cfg}, default=str))


def _without_nulls(d):
    """A JSON value with the null entries of its mappings dropped, at every depth."""
    if isinstance(d, dict):
        return {k: _without_nulls(v) for k, v in d.items() if v is not None}
    return d


def check_recorded_config(row, cfg, name: str, source: str) -> None:
    """Refuse (``ValueError``) a recorded row of run ``name`` (from file ``source``) whose recorded config
    is missing or differs from ``cfg``, the config the run would be trained with now: a stale row never
    enters a table."""
    want = run_config_record(cfg)
    got = row.get("run_config")
    if got is None:
        raise ValueError(f"reuse: the row of {name} in {source!r} does not record its config (written before "
                         "run configs were recorded); train it again")
    # an option added later with a null default (null: the earlier behaviour) leaves older rows valid
    want, got = _without_nulls(want), _without_nulls(got)
    if got != want:
        diff = sorted(k for k in set(want) | set(got) if got.get(k) != want.get(k))
        raise ValueError(f"reuse: the row of {name} in {source!r} was trained with a different config (sections "
                         f"{', '.join(diff)} differ): train it again or drop the file")


def without_bookkeeping(argv) -> list:
    """``argv`` without the options that change no result -- ``--resume``, ``--overwrite``, ``--reused-only``
    and ``--reuse`` with its files --, so a document records the command that computes its rows from scratch."""
    out, skipping = [], False
    for a in argv:
        if a in ("--resume", "--overwrite", "--reused-only"):
            continue
        if a == "--reuse" or a.startswith("--reuse="):
            skipping = a == "--reuse"
            continue
        if skipping and not a.startswith("--"):
            continue
        skipping = False
        out.append(a)
    return out


@contextlib.contextmanager
def _folder_lock(folder: str):
    """An exclusive advisory lock on ``folder`` (flock on the directory itself: no lock file left
    behind) while the block runs; no lock where the platform has no flock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing releases the lock


def write_section(path: str, name: str, text: str, command: str) -> None:
    """Replace the ``name`` section of the markdown file at ``path`` atomically, keeping the rest.

    The read-modify-write holds a lock on the file's folder, so two benchmark processes that finish
    at the same time each keep the other's section (neither writes over a file it has not read)."""
    from ..files import atomic_write

    start, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    body = f"{start}\nGenerated by `{command}`.\n\n{text}\n{end}"
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with _folder_lock(folder):
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmarks\n"
        if start in old and end in old:
            new = old[:old.index(start)] + body + old[old.index(end) + len(end):]
        else:
            new = old.rstrip("\n") + "\n\n" + body + "\n"
        atomic_write(path, lambda f: f.write(new.encode("utf-8")))
