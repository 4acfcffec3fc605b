"""The package's shape, read from its source: one home per idea, layers that only import downwards,
no import circle, and imports inside functions only for optional dependencies."""

import ast
import collections
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lpes_nb"
# the sub-packages, bottom to top; a module imports only from its own folder or the ones below
LAYERS = ("system", "core", "store", "evaluation", "studies", "workbook", "operations")
ENTRY = ("__init__", "__main__", "cli")  # the package's face: the `lpes` command and the lazy public API
OPTIONAL = {"ray", "flash_attn", "voila"}  # may be imported inside the function that needs them
# the core's GA builds its history tables on first use, so a researcher's own code that imports only
# the core never loads pandas
OPTIONAL_IN = {"core": {"pandas"}}


def _modules() -> dict[str, ast.Module]:
    """Every module under a layer folder, named ``folder.module``."""
    return {f"{p.parent.name}.{p.stem}": ast.parse(p.read_text()) for p in sorted(PACKAGE.glob("*/*.py")) if p.stem != "__init__"}


def _targets(name: str, node: ast.ImportFrom, names: set[str]) -> set[str]:
    """The package modules a relative ``from … import …`` in module ``name`` reaches."""
    folder = name.split(".")[0]
    base = {1: [folder], 2: []}[node.level] + (node.module.split(".") if node.module else [])
    if len(base) == 2:
        return {".".join(base)} if ".".join(base) in names else set()
    return {f"{base[0]}.{a.name}" for a in node.names if f"{base[0]}.{a.name}" in names}


def _edges(trees) -> dict[str, set[str]]:
    edges = collections.defaultdict(set)
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                edges[name] |= _targets(name, node, set(trees))
    return edges


def test_every_module_sits_in_a_layer_folder_that_says_what_it_holds():
    assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(LAYERS)
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted(ENTRY)
    for folder in LAYERS:
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""
        unnamed = [p.stem for p in (PACKAGE / folder).glob("*.py") if p.stem != "__init__" and f"{p.stem}" not in doc]
        assert unnamed == [], f"lpes_nb/{folder}/__init__.py does not say it holds {unnamed}"


def test_the_layout_page_shows_the_layers():
    """A reader finds any module's layer in the layout page (docs/layout.md); it names every module, each under its folder."""
    text = (PACKAGE.parent / "docs" / "layout.md").read_text()
    block = text[text.index("lpes_nb/      the package"):text.index("notebooks/    numbered")]
    shown, layer = collections.defaultdict(set), None
    for line in block.splitlines()[1:]:
        if match := re.match(r"  (\w+)/", line):
            layer = match[1]
        elif match := re.match(r"    (\w+) ", line):
            shown[layer].add(match[1])
    assert list(shown) == list(LAYERS)
    on_disk = collections.defaultdict(set)
    for name in _modules():
        on_disk[name.split(".")[0]].add(name.split(".")[1])
    assert {k: sorted(v) for k, v in shown.items()} == {k: sorted(v) for k, v in on_disk.items()}


def test_imports_only_point_down():
    layer = {name: LAYERS.index(name.split(".")[0]) for name in _modules()}
    upward = [f"{a} -> {b}" for a, targets in _edges(_modules()).items() for b in targets if layer[b] > layer[a]]
    assert upward == []


def test_the_edges_are_read_from_both_kinds_of_relative_import():
    tree = ast.parse("from .rope import x\nfrom ..store.results import y\nfrom ..store import data\nfrom . import bezier\n")
    assert _edges({"core.ga": tree, "core.rope": tree, "store.results": tree, "store.data": tree, "core.bezier": tree})["core.ga"] == {
        "core.rope", "store.results", "store.data", "core.bezier"}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert _cycles(_edges(_modules())) == []


def test_the_circle_finder_finds_circles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_only_for_optional_dependencies():
    found = []
    for name, tree in _modules().items():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        tops = {a.name.split(".")[0] for a in node.names}
                    elif isinstance(node, ast.ImportFrom):
                        tops = {"." if node.level else node.module.split(".")[0]}
                    else:
                        continue
                    if tops - OPTIONAL - OPTIONAL_IN.get(name.split(".")[0], set()):
                        found.append(f"{name}.{fn.name}: {ast.unparse(node)}")
    assert found == []


def _fresh(code: str) -> str:
    """What ``code`` prints in a fresh Python process (imports there start from nothing)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_the_gpu_kit_imports_without_the_notebook_engine():
    """A GPU machine without network has torch and transformers, not papermill or nbformat."""
    assert _fresh("import sys; sys.modules.update(papermill=None, nbformat=None); import lpes_nb.operations.gpu_kit, "
                  "lpes_nb.operations.carry; print(sorted(m for m in ('papermill', 'nbformat') if sys.modules[m] is not None))") == "[]"


def test_the_core_imports_only_torch_numpy_and_transformers():
    """`import lpes_nb.core` in a fresh process: the method, and none of the notebooks' machinery."""
    assert _fresh("import sys; import lpes_nb.core; from lpes_nb.core import bezier, ga, interventions, methods, rope; "
                  "print(sorted(m for m in ('pandas', 'matplotlib', 'seaborn', 'ipywidgets', 'papermill', 'statsmodels') "
                  "if m in sys.modules))") == "[]"


def test_the_top_level_hands_on_the_public_api_without_loading_torch_at_import():
    assert _fresh("import sys, lpes_nb; light = 'torch' not in sys.modules; print(light, all(getattr(lpes_nb, n).__name__ == n "
                  "for n in lpes_nb.PUBLIC), 'apply' in dir(lpes_nb))").split() == ["True", "True", "True"]
