"""The HTML API reference of pointformers, generated from the docstrings with pdoc (``make api-docs``).

    python scripts/api_docs.py [OUT]          # default OUT: build/api; open OUT/index.html

Every public module of the package gets a page (each one whose dotted name has no part starting
with ``_``), not only those that the packages' ``__all__`` name: ``pointformers.engine.config``,
the data generators and each mechanism's module included. Docstrings are read as Google style
(``Args:``, ``Returns:``) with reST roles (``:func:`...```).

Exit status 1 if pdoc warns (a module that does not import, an annotation or a docstring it
cannot process, ...): each warning is printed. Needs the ``docs`` extra (pdoc) and the modules'
own dependencies (the ``test`` extra has both).
"""
from __future__ import annotations

import os
import pkgutil
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def public_modules(package: str = "pointformers") -> list[str]:
    """Dotted names of the package and every public submodule, parents before children."""
    import importlib

    pkg = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")]
    return sorted((n for n in names if not any(part.startswith("_") for part in n.split("."))),
                  key=lambda n: n.split("."))


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "build" / "api"
    os.environ.setdefault("MPLBACKEND", "Agg")
    import pdoc
    import pdoc.extract
    import pdoc.render

    pdoc_dir = str(Path(pdoc.__file__).parent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # pdoc documents a spec and its submodules (those in a package's __all__, if it has one):
        # name the package, then each module that no spec named so far reaches, so every module
        # gets exactly one page.
        specs: list[str] = []
        reached: set[str] = set()
        for name in public_modules():
            if name not in reached:
                specs.append(name)
                reached.update(pdoc.extract.walk_specs([name]))
        pdoc.render.configure(docformat="google", footer_text="pointformers API reference")
        pdoc.pdoc(*specs, output_directory=out)
    problems = [w for w in caught if w.filename.startswith(pdoc_dir)]
    for w in problems:
        print(f"pdoc warning: {w.message}", file=sys.stderr)
    pages = sum(1 for _ in out.rglob("*.html"))
    if problems:
        print(f"api-docs: FAILED, {len(problems)} warning(s) from pdoc ({pages} pages in {out})", file=sys.stderr)
        return 1
    print(f"api-docs: {len(reached)} modules, {pages} pages in {out} (open {out / 'index.html'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
