"""calculators/ imports form no circle: result types sit below the engines that fill them.

The walk is static (ast) and counts every import, those inside functions too, so a circle cannot
hide behind a late import.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Each module of ``root/package`` and the modules of the same package its imports run."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = here[: len(here) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # ``from pkg import sub`` imports the module pkg.sub when there is one
                targets |= {f"{base}.{a.name}" for a in node.names} | {base}
        # importing a.b.c first runs the packages a and a.b, except those being run already
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        parents = {".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 1)}
        graph[name] = {t for t in targets | (parents - own) if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_calculators_have_no_import_cycle() -> None:
    graph = module_graph(ROOT, "calculators")
    assert "calculators.engines.deepspeed.memory" in graph  # the walk sees the engine folders
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_walk_finds_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "engines").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "memory.py").write_text(
        "from pkg.types import Estimate\n\n\ndef estimate():\n    from pkg.engines import model\n"
    )
    (pkg / "types.py").write_text("Estimate = int\n")
    (pkg / "engines" / "__init__.py").write_text("from . import model\n")
    (pkg / "engines" / "model.py").write_text("from ..memory import estimate\n")
    graph = module_graph(tmp_path, "pkg")
    assert graph["pkg.engines"] == {"pkg.engines.model"}
    assert graph["pkg.engines.model"] == {"pkg.memory"}
    assert find_cycle(graph) == ["pkg.engines", "pkg.engines.model", "pkg.memory", "pkg.engines"]
    (pkg / "memory.py").write_text("from pkg.types import Estimate\n")
    assert find_cycle(module_graph(tmp_path, "pkg")) is None
