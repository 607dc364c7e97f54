"""The package's shape (issue 31, ../shared/ARCHITECTURE.md): a handful of foundations at the root,
no import cycle between any two modules (lazy imports and TYPE_CHECKING ones included), the layers
of .importlinter kept, and the module names of the flat layout still importing as the moved modules."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import polar_mq

ROOT = Path(__file__).resolve().parents[2]
FOUNDATIONS = {"__init__", "auth", "client", "model", "sampling", "settings", "states", "taskspec"}


def test_the_package_root_holds_only_the_foundations():
    root = {p.stem for p in (ROOT / "polar_mq").glob("*.py")}
    assert root == FOUNDATIONS


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    mods = sorted(graph.modules)
    adj = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in mods:
        if start in index:
            continue
        work = [(start, iter(adj[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(adj[w])))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycle_between_any_two_modules():
    assert _cycles(grimp.build_graph("polar_mq")) == []


def test_a_cycle_is_found_when_there_is_one(tmp_path, monkeypatch):
    """The check above can fail: two modules importing each other (one lazily) are a cycle."""
    pkg = tmp_path / "cyclic_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic_pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from cyclic_pkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(grimp.build_graph("cyclic_pkg")) == [["cyclic_pkg.a", "cyclic_pkg.b"]]


def test_the_import_contract_holds():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize("old, new", sorted(polar_mq._MOVED.items()))
def test_module_names_of_the_flat_layout_import_as_the_moved_module(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_python_dash_m_of_an_old_name_runs_the_moved_module():
    out = subprocess.run([sys.executable, "-m", "polar_mq.model_server", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--port" in out.stdout, out.stderr[-2000:]
