"""The package layout stays true: imports go only downward through the layers, and no
module imports itself back through another (docs/design.md, "Map")."""

from __future__ import annotations

import ast
from pathlib import Path

import attnbench

PACKAGE = Path(attnbench.__file__).parent
IMPLEMENTATIONS = PACKAGE.parent.parent / "implementations"
# Bottom to top: a module may import its own layer and the layers before it.
# ``api`` is the public Python API (attnbench.api), which the commands use too.
LAYERS = ("stats", "core", "measure", "analysis", "runs", "reporting", "api", "commands")
# The entry points and the old import paths third-party backends use.
TOP_LEVEL = {"__init__", "__main__", "cli", "backend", "case"}
# The one import up the layers a backend may make: the timing loop, so that a kernel's
# autotuner times its candidates as the records are timed (one loop, one L2 flush).
BACKENDS_MAY_IMPORT = {"attnbench.measure.timing"}


def module_name(path: Path, root: Path, prefix: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join([prefix, *parts])


def imported(path: Path, name: str) -> set[str]:
    """Every attnbench module ``path`` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.startswith("attnbench"):
                out.update(f"{base}.{a.name}" for a in node.names)
                out.add(base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("attnbench"))
    return out


def all_modules() -> dict[str, Path]:
    found = {module_name(p, PACKAGE, "attnbench"): p for p in PACKAGE.rglob("*.py")}
    found |= {module_name(p, IMPLEMENTATIONS, "attnbench.implementations"): p
              for p in IMPLEMENTATIONS.rglob("*.py")}
    return found


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {m: {d for d in imported(p, m) if d in modules and d != m}
            for m, p in modules.items()}


def layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[1] == "implementations":
        return LAYERS.index("core")  # backends build on what a case and a record are
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else None


def test_every_module_is_in_a_layer_or_a_named_entry_point():
    loose = sorted(m for m in all_modules() if layer(m) is None
                   and m.split(".")[1] not in TOP_LEVEL and m != "attnbench")
    assert loose == []


def allowed(module: str, dep: str) -> bool:
    """Whether ``module`` may import ``dep``: its own layer or one below, or the named
    exception for backends."""
    own, theirs = layer(module), layer(dep)
    if theirs is not None and theirs <= own:
        return True
    return module.startswith("attnbench.implementations.") and dep in BACKENDS_MAY_IMPORT


def test_imports_only_go_down_the_layers():
    upward = []
    for module, deps in graph().items():
        if layer(module) is None:
            continue
        upward += [f"{module} imports {dep}" for dep in deps if not allowed(module, dep)]
    assert upward == []


def test_backends_may_import_the_timing_loop_and_nothing_else_above_core(tmp_path):
    """The exception is one module wide: a backend importing the timing loop passes, one
    importing anything else of measure (or the timing module's neighbours) is caught."""
    fake = tmp_path / "fake.py"
    fake.write_text("from attnbench.measure.timing import measure_interleaved\n")
    module = "attnbench.implementations.fake"
    deps = imported(fake, module) & set(all_modules())
    assert "attnbench.measure.timing" in deps
    assert all(allowed(module, d) for d in deps)
    for other in ("attnbench.measure.worker", "attnbench.measure.timing_methods",
                  "attnbench.runs.runner"):
        assert not allowed(module, other)
    assert not allowed("attnbench.core.case", "attnbench.measure.timing")


def test_no_import_circle():
    g = graph()
    state: dict[str, int] = {}
    circles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                circles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert circles == []


def test_a_lower_layer_importing_a_higher_one_is_caught(tmp_path):
    """The check itself can fail: a core module importing a command is reported."""
    fake = tmp_path / "fake.py"
    fake.write_text("from attnbench.commands import run\n")
    deps = imported(fake, "attnbench.core.fake")
    assert any(layer(d) is not None and layer(d) > layer("attnbench.core.fake") for d in deps)


def test_old_import_paths_of_third_party_backends_still_work():
    import attnbench.backend as old_backend
    import attnbench.case as old_case
    from attnbench.core import backend, case

    assert old_backend.Backend is backend.Backend
    assert old_case.Case is case.Case
