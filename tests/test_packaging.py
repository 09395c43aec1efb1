"""Packaging: core dependencies vs extras, and the install hint for a missing optional package.

The built wheel itself (package data, a fresh environment, the command) is checked by
``make wheel-smoke`` (scripts/wheel_smoke.sh), a step of .ci/run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pointformers.cli import OPTIONAL_DEPENDENCIES, main

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_core_dependencies_are_torch_and_numpy():
    assert _names(_project()["dependencies"]) == {"torch", "numpy"}


def test_every_optional_module_is_in_its_extra():
    extras = _project()["optional-dependencies"]
    for module, (pip_name, extra) in OPTIONAL_DEPENDENCIES.items():
        if module == "awkward":  # comes with uproot
            assert "uproot" in _names(extras[extra])
            continue
        assert pip_name.lower() in _names(extras[extra]), (module, extra)
    every = {e for e in extras if e not in ("all", "test", "docs")}  # docs: tooling (pdoc), in test only
    assert extras["all"] == [f"pointformers[{','.join(sorted(every, key=list(extras).index))}]"]
    assert "pointformers[all,docs]" in extras["test"] and _names(extras["docs"]) == {"pdoc"}


def test_package_data_files_exist():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["pointformers"]
    pkg = ROOT / "src" / "pointformers"
    for pattern in globs:
        assert list(pkg.glob(pattern)), pattern
    for name in ("models/weights/hept-tracking-60k.pt", "models/weights/LICENSE-HEPT",
                 "data/trackml_pixel_detectors.csv", "data/trackml_pixel_detectors.README.md"):
        assert any((pkg / name).match(str(pkg / g)) for g in globs), name
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_cli_names_the_extra_of_a_missing_package(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"epochs": [{"epoch": 1, "lr": 0.1, "train_loss": 1.0, "val": {}}]}))
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # import of it fails with ModuleNotFoundError
    assert main(["plot", str(run), "--no-task-plots"]) == 2
    err = capsys.readouterr().err
    assert "pointformers plot: error:" in err and "pip install 'pointformers[plots]'" in err
    assert not (run / "learning_curves.png").exists()


def test_library_modules_name_the_extra():
    """Importing a module whose optional dependency is missing says which extra to install."""
    code = """
import sys
for m in ("scipy", "sklearn", "matplotlib"):
    sys.modules[m] = None
for mod in ("pointformers.data.tracking", "pointformers.data.shapes", "pointformers.tasks.tracking",
            "pointformers.tasks.tracking.building", "pointformers.bench.plots"):
    try:
        __import__(mod)
    except ModuleNotFoundError as exc:
        print(mod, exc.name, "|", exc)
    else:
        print(mod, "imported")
import pointformers.attention, pointformers.models  # the core needs none of them
print("core ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines() if line != "core ok")
    assert out.stdout.strip().endswith("core ok")
    for mod in ("pointformers.data.tracking", "pointformers.data.shapes", "pointformers.tasks.tracking"):
        assert lines[mod].startswith("scipy") and "needs scipy: pip install 'pointformers[tasks]'" in lines[mod], lines[mod]
    assert "pip install 'pointformers[tasks]'" in lines["pointformers.tasks.tracking.building"]  # scipy first
    assert lines["pointformers.bench.plots"].startswith("matplotlib")
    assert "needs matplotlib: pip install 'pointformers[plots]'" in lines["pointformers.bench.plots"]


@pytest.mark.parametrize("extra", ["tasks", "plots", "export", "io", "logging"])
def test_readme_lists_every_extra(extra):
    assert f"`{extra}`" in (ROOT / "README.md").read_text()
