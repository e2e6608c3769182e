"""The wheel installs flexsearch.attacks and flexsearch.objectives, and no bare top-level packages; the
import graph has no cycle and no upward import between the layers of the folder tree."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_subpackages(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), "-q"], check=True)
    wheel = next((tmp_path / "dist").glob("flexsearch-*.whl"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    assert not (target / "attacks").exists() and not (target / "objectives").exists()
    assert (target / "flexsearch" / "attacks").is_dir() and (target / "flexsearch" / "configs").is_dir()
    code = ("import flexsearch, flexsearch.attacks, flexsearch.objectives, flexsearch.data.items as i;"
            "print(flexsearch.attacks.__file__); print(len(i.load_items('seed').items))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(target)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0].startswith(str(target)) and int(out[1]) >= 60


def test_editable_install_resolves_subpackages_from_the_tree():
    import flexsearch.attacks
    import flexsearch.objectives

    assert Path(flexsearch.attacks.__file__).parent == ROOT / "attacks"
    assert Path(flexsearch.objectives.__file__).parent == ROOT / "objectives"


def _without_type_checking_blocks(tree: ast.Module) -> ast.Module:
    """The module without its `if TYPE_CHECKING:` blocks: imports for annotations only never run."""
    tree.body = [node for node in tree.body if not (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                                                    and node.test.id == "TYPE_CHECKING")]
    return tree


def _import_graph() -> dict[str, set[str]]:
    """Module → the package modules it imports anywhere in its file (lazy, function-level imports too; imports for
    type annotations only, under `if TYPE_CHECKING:`, run never and are left out)."""
    files = {}
    for folder, package in (("flexsearch", "flexsearch"), ("attacks", "flexsearch.attacks"),
                            ("objectives", "flexsearch.objectives")):
        for path in (ROOT / folder).rglob("*.py"):
            parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        found: set[str] = set()
        for node in ast.walk(_without_type_checking_blocks(ast.parse(path.read_text(encoding="utf-8")))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def test_the_import_graph_has_no_cycle():
    graph = _import_graph()
    assert len(graph) > 30 and "flexsearch.attacks.base" in graph
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dependency in sorted(graph[module]):
            assert state.get(dependency) != "open", " -> ".join([*path, module, dependency])
            if dependency not in state:
                visit(dependency, [*path, module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


# The folder tree's layers, lowest first (DESIGN.md "Module map"): a module imports its own layer and those below.
# A package's name covers its submodules unless a longer name places one elsewhere: within the machinery the order
# runs by module, because the config reads the registries (attacks, objectives, search methods) and the drivers read
# the config (the scorer, the search loop).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shared", ("flexsearch.errors", "flexsearch.registry", "flexsearch.version", "flexsearch.files")),
    ("data", ("flexsearch.data",)),
    ("model loading", ("flexsearch.scoring.model",)),
    ("objectives", ("flexsearch.objectives",)),
    ("attacks", ("flexsearch.attacks",)),
    ("search methods", ("flexsearch.engine",)),
    ("config", ("flexsearch.config",)),
    ("scoring", ("flexsearch.scoring",)),
    ("search drivers", ("flexsearch.engine.loop", "flexsearch.engine.distributed")),
    ("results", ("flexsearch.results",)),
    ("pipeline", ("flexsearch.pipeline", "flexsearch.zoo")),
    ("entry", ("flexsearch.api", "flexsearch.cli", "flexsearch.__main__", "flexsearch")),
)


def layer_of(module: str) -> int:
    """The layer holding `module`: the layer of the longest name that is the module or a package above it."""
    found = [(len(name), k) for k, (_, names) in enumerate(LAYERS) for name in names
             if module == name or (name != "flexsearch" and module.startswith(name + "."))]
    assert found, f"{module}: in no layer; LAYERS must place every module"
    return max(found)[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
            for m, deps in sorted(graph.items()) for d in sorted(deps) if layer_of(d) > layer_of(m)]


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(_import_graph()) == []


def test_the_layer_check_fails_on_an_upward_import():
    """The check can fail: the results layer reaching up into the pipeline, data into the engine, and within the
    machinery the config into the search loop or an operator into the config are caught."""
    graph = {"flexsearch.results.metrics": {"flexsearch.pipeline.search"},
             "flexsearch.data.items": {"flexsearch.engine.loop", "flexsearch.errors"},
             "flexsearch.config": {"flexsearch.engine.loop", "flexsearch.engine.methods"},
             "flexsearch.attacks.base": {"flexsearch.config", "flexsearch.scoring.model"},
             "flexsearch.api": {"flexsearch.results.metrics"}}
    assert upward_imports(graph) == [
        "flexsearch.attacks.base (attacks) imports flexsearch.config (config)",
        "flexsearch.config (config) imports flexsearch.engine.loop (search drivers)",
        "flexsearch.data.items (data) imports flexsearch.engine.loop (search drivers)",
        "flexsearch.results.metrics (results) imports flexsearch.pipeline.search (pipeline)"]


def test_a_search_method_file_depends_on_the_seam_not_on_the_driver_or_another_method():
    """One file per method (issue 47): a method reads the per-item state and registers itself; it imports neither the
    loop that drives it nor another method, so adding or removing one touches that file and its registration only."""
    graph = _import_graph()
    methods = {m for m in graph if m.startswith("flexsearch.engine.methods.")} - {"flexsearch.engine.methods.base"}
    assert {"flexsearch.engine.methods.learned", "flexsearch.engine.methods.beam"} <= methods
    for method in methods:
        assert not graph[method] & (methods | {"flexsearch.engine.loop", "flexsearch.engine.methods"}), method


def test_the_api_keeps_its_public_names_and_a_moved_one_warns():
    """Public surface unchanged (issue 47): every public name flexsearch.api had before the pipeline moved out is
    still there; the three helpers that moved answer with a DeprecationWarning naming their new home."""
    import warnings

    import flexsearch.api as api
    from flexsearch.pipeline import search as pipeline

    for name in ("Target", "RayOptions", "default_run_dir", "search", "evaluate", "registries", "mutate", "audit",
                 "compare"):
        assert callable(getattr(api, name)), name
    for name in ("split_file_of", "family_block", "SEARCH_PROMPT_MARGIN"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert getattr(api, name) is getattr(pipeline, name)
        assert [str(w.message) for w in caught] == [
            f"flexsearch.api.{name} is deprecated: import it from flexsearch.pipeline.search"]
        assert caught[0].category is DeprecationWarning
