#!/usr/bin/env bash
# Wheel smoke test (`make wheel-smoke`, a step of .ci/run): build the wheel from the working tree,
# install it into a fresh virtual environment and use it from outside the source tree.
#
#   1. build: `pip wheel --no-deps` on a copy of the tracked and untracked-but-not-ignored files
#      (a stale build/ folder or egg-info of the checkout cannot leak into the wheel); the wheel
#      must hold the package data (checkpoint, its licence, detector table, py.typed).
#   2. core install (torch==2.13.0 first, then the wheel without extras): import the layers and
#      the models, build every registered model, load the shipped checkpoint and run it;
#      `pointformers --help`; a command that needs an extra names it.
#   3. the `tasks` extra added: generate a tiny event on the packaged detector table and run the
#      shipped checkpoint on the first 2,000 hits of a generated event.
#
# Environment: PYTHON (default python3) makes the venv; KEEP=1 keeps the temporary folder.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/pointformers-wheel-smoke.XXXXXX")"
if [ "${KEEP:-0}" = 1 ]; then
    echo "wheel-smoke: keeping $TMP"
else
    trap 'rm -rf "$TMP"' EXIT
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 POINTFORMERS_CACHE="$TMP/cache"
start=$(date +%s)
step() { echo "wheel-smoke [$(( $(date +%s) - start )) s]: $*"; }

step "copying the source tree to $TMP/src"
mkdir -p "$TMP/src" "$TMP/dist" "$TMP/work"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # files deleted in the working tree but still in the index are skipped
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
        | tar --null -T - -cf -) | tar -xf - -C "$TMP/src"
else
    tar -C "$ROOT" --exclude=./.venv --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ \
        --exclude=./runs --exclude=./.pointformers-cache -cf - . | tar -xf - -C "$TMP/src"
fi

step "creating a fresh virtual environment"
"$PYTHON" -m venv "$TMP/venv"
PY="$TMP/venv/bin/python"
"$PY" -m pip install --quiet --upgrade pip

step "building the wheel"
"$PY" -m pip wheel --quiet --no-deps -w "$TMP/dist" "$TMP/src"
WHEEL="$(ls "$TMP"/dist/pointformers-*.whl)"
step "built $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)"
"$PY" - "$WHEEL" <<'EOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["pointformers/__init__.py", "pointformers/py.typed", "pointformers/cli.py",
        "pointformers/models/weights/hept-tracking-60k.pt", "pointformers/models/weights/LICENSE-HEPT",
        "pointformers/models/weights/README.md", "pointformers/data/trackml_pixel_detectors.csv",
        "pointformers/data/trackml_pixel_detectors.README.md"]
missing = [n for n in need if n not in names]
licences = sorted(n for n in names if "/licenses/" in n)
assert not missing, f"not in the wheel: {missing}"
assert any(n.endswith("/LICENSE") for n in licences) and any(n.endswith("LICENSE-HEPT") for n in licences), licences
assert not any(n.startswith(("tests/", "configs/", "docs/")) or "__pycache__" in n for n in names)
meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
text = zipfile.ZipFile(sys.argv[1]).read(meta).decode()
assert "License-Expression: MIT" in text and "Requires-Dist: torch<2.14,>=2.13" in text, text[:2000]
print(f"  {len(names)} files; package data and licences ({', '.join(l.split('/')[-1] for l in licences)}) present")
EOF

step "installing torch==2.13.0, then the wheel (no extras)"
"$PY" -m pip install --quiet torch==2.13.0
"$PY" -m pip install --quiet "$WHEEL"

cd "$TMP/work"  # outside the source tree: only the installed package can be imported
step "core checks"
"$PY" - <<'EOF'
import importlib.util, pathlib, sys

import torch

import pointformers
from pointformers import attention, models

where = pathlib.Path(pointformers.__file__).resolve()
assert "site-packages" in where.parts, f"pointformers imported from {where}, not the installed wheel"
for name in ("scipy", "sklearn", "matplotlib", "yaml", "tqdm", "onnx"):
    assert importlib.util.find_spec(name) is None, f"{name} is installed without its extra"

torch.manual_seed(0)
attn = attention.build("hept", dim=24, heads=8, coord_dim=2, block_size=100, n_hashes=3, num_regions=150)
x, pos = torch.randn(2, 500, 24), torch.randn(2, 500, 2)
y = attn(x, pos, torch.ones(2, 500, dtype=torch.bool))
assert y.shape == (2, 500, 24) and torch.isfinite(y).all()

names = models.available()
for name in names:
    models.build(name)
model = models.build("hept-tracking")
print(f"  {len(names)} registered models build; hept-tracking: {sum(p.numel() for p in model.parameters()):,} parameters")

ref = models.from_reference_checkpoint("hept-tracking-60k").eval()
with torch.no_grad():
    emb = ref(torch.randn(300, 15), torch.randn(300, 6))
assert emb.shape == (300, 12) and torch.isfinite(emb).all()

try:
    import pointformers.data.tracking  # noqa: F401
except ModuleNotFoundError as exc:
    assert "pip install 'pointformers[tasks]'" in str(exc), exc
else:
    raise AssertionError("pointformers.data.tracking imported without scipy")
print("  layers, models and the shipped checkpoint work with torch and numpy only")
EOF
"$TMP/venv/bin/pointformers" --help >/dev/null
set +e
msg="$("$TMP/venv/bin/pointformers" generate --set data.preset=tiny 2>&1)"
rc=$?
set -e
echo "  pointformers generate without the extra: exit $rc: $msg"
[ "$rc" = 2 ] && grep -q "pip install 'pointformers\[tasks\]'" <<<"$msg"

step "installing the wheel's 'tasks' extra"
"$PY" -m pip install --quiet "$WHEEL[tasks]"
step "tasks checks"
"$PY" - <<'EOF'
import torch

from pointformers import models
from pointformers.data import tracking
from pointformers.tasks.tracking import generated_inputs

assert tracking.DETECTORS_FILE.is_file() and "site-packages" in tracking.DETECTORS_FILE.parts
event = tracking.generate_event(tracking.preset_params("tiny"), seed=0)
n_hits, n_particles = len(event.hit_id), len(set(event.particle_id.tolist()) - {0})
assert n_hits > 0 and n_particles > 0
print(f"  tiny event on the packaged detector table: {n_hits} hits of {n_particles} particles")

x, coords = generated_inputs(2000, seed=0)
assert x.shape == (2000, 15) and coords.shape == (2000, 6)
model = models.from_reference_checkpoint("hept-tracking-60k").eval()
with torch.no_grad():
    emb = model(x, coords)
assert emb.shape == (2000, 12) and torch.isfinite(emb).all()
print(f"  hept-tracking-60k on the first 2,000 hits of a generated event: embeddings {tuple(emb.shape)}")
EOF
"$TMP/venv/bin/pointformers" --help >/dev/null
step "ok ($(( $(date +%s) - start )) s)"
