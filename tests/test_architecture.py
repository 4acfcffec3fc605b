"""The package's shape, read from its source: one home per idea, layers that only import downwards,
no import circle, and imports inside functions only for optional dependencies."""

import ast
import collections
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lpes_nb"
# bottom to top; a module imports only from its own layer or the ones below
LAYERS = {
    "store": ("machine", "footprint", "results", "timing", "carry", "splits"),
    "core": ("cost_model", "data", "metrics", "bezier", "interventions", "rope", "bf16_gemm", "models", "methods", "prefix", "tasks", "evaluate",
             "training", "moice", "position_gate", "stored_curve"),
    "search": ("fitness", "ga", "distributed", "search"),
    "profiles": ("profiles",),
    "studies": ("attention", "representations", "probes", "precision", "calibration", "benchmarks", "throughput",
                "position_map", "regime_search", "second_model", "fitness_proxy", "lpes_at_power", "claims"),
    "workbook": ("plots", "widgets", "notebook", "run", "costs", "gpu_kit", "cli"),
}
OPTIONAL = {"ray", "flash_attn", "voila"}  # may be imported inside the function that needs them


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text()) for p in sorted(PACKAGE.glob("*.py")) if p.stem not in ("__init__", "__main__")}


def _edges(trees) -> dict[str, set[str]]:
    edges = collections.defaultdict(set)
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                for target in ([node.module] if node.module else [a.name for a in node.names]):
                    if target.split(".")[0] in trees:
                        edges[name].add(target.split(".")[0])
    return edges


def _layer_of() -> dict[str, int]:
    return {m: i for i, modules in enumerate(LAYERS.values()) for m in modules}


def test_every_module_has_a_layer():
    layer, names = _layer_of(), set(_modules())
    assert names - set(layer) == set(), "place new modules in LAYERS"
    assert set(layer) - names == set(), "LAYERS names modules that do not exist"


def test_the_layout_page_shows_the_layers():
    """A reader finds any module's layer in the layout page (docs/layout.md); it names every module, each under its layer."""
    text = (PACKAGE.parent / "docs" / "layout.md").read_text()
    block = text[text.index("lpes_nb/      the package"):text.index("notebooks/    numbered")]
    shown, layer = collections.defaultdict(set), None
    for line in block.splitlines()[1:]:
        if match := re.fullmatch(r"  (\w+):", line):
            layer = match[1]
        elif match := re.match(r"    (\w+) ", line):
            shown[layer].add(match[1])
    assert list(shown) == list(LAYERS)
    assert {k: sorted(v) for k, v in shown.items()} == {k: sorted(v) for k, v in LAYERS.items()}


def test_imports_only_point_down():
    layer, names = _layer_of(), list(LAYERS)
    upward = [f"{a} ({names[layer[a]]}) -> {b} ({names[layer[b]]})"
              for a, targets in _edges(_modules()).items() for b in targets if layer[b] > layer[a]]
    assert upward == []


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
                    if tops - OPTIONAL:
                        found.append(f"{name}.{fn.name}: {ast.unparse(node)}")
    assert found == []


def test_the_gpu_kit_imports_without_the_notebook_engine():
    """A GPU machine without network has torch and transformers, not papermill or nbformat."""
    code = ("import sys; sys.modules.update(papermill=None, nbformat=None); import lpes_nb.gpu_kit, lpes_nb.carry; "
            "print(sorted(m for m in ('papermill', 'nbformat') if sys.modules[m] is not None))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
