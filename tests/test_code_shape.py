"""The framework stays small and generic: it names no policy or env family. Its files and functions,
those of the families (models/, envs/) and of the scripts, benchmarks and examples stay short
enough to read (docstrings and comments excluded). models/ and envs/ never import each other, and
no modules import each other in a cycle."""

import ast
import os
import re
from collections import deque
from typing import Dict, Iterator, List, Set

from conftest import REPO_ROOT

from embodied_async.registry import families

PACKAGES = ("embodied_async", "models", "envs")  # the framework and the two plugin families
# "fetch" (gymnasium-robotics' Fetch family) is also what a config does to its checkpoint (fetch())
SHARED_WITH_CODE = {"fetch"}


def family_names() -> Set[str]:
    """Every policy and env family the entry points register and every package under models/ and
    envs/, so a new family is checked without editing this file."""
    names = set(families("model")) | set(families("env"))
    for plugins in ("models", "envs"):
        names |= {name for name in os.listdir(os.path.join(REPO_ROOT, plugins))
                  if os.path.isdir(os.path.join(REPO_ROOT, plugins, name)) and not name.startswith("_")}
    return names - SHARED_WITH_CODE
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 60
ENTRY_FOLDERS = ("scripts", "benchmarks", "examples")  # the Python beside the packages: what users run


def python_files(*packages: str):
    """``(path relative to the repository, source)`` of every .py file under ``packages``."""
    for package in packages:
        for folder, _, files in sorted(os.walk(os.path.join(REPO_ROOT, package))):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path) as f:
                        yield os.path.relpath(path, REPO_ROOT), f.read()


def framework_files():
    return python_files("embodied_async")


def _docstring(node) -> ast.Expr:
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0]
    return None


def code_without_docs(source: str) -> str:
    """The module re-written from its syntax tree: no comments, docstrings emptied."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        doc = _docstring(node)
        if doc is not None:
            doc.value.value = ""
    return ast.unparse(tree)


def test_the_framework_names_no_family():
    names = family_names()
    assert {"openvla", "pi0", "libero", "robosuite", "metaworld", "maniskill", "mlp"} <= names
    pattern = re.compile("|".join(sorted(names, key=len, reverse=True)), re.IGNORECASE)
    found = {path: sorted(set(pattern.findall(code_without_docs(source))))
             for path, source in framework_files()}
    assert not {path: names for path, names in found.items() if names}


def _function_lines(node) -> int:
    """Lines of a function's definition, its docstring excluded."""
    lines = node.end_lineno - node.lineno + 1
    doc = _docstring(node)
    return lines - (doc.end_lineno - doc.lineno + 1) if doc is not None else lines


def test_files_and_functions_stay_short():
    """All Python code: the packages, the scripts, the benchmarks and the examples."""
    too_long = []
    for path, source in python_files(*PACKAGES, *ENTRY_FOLDERS):
        if source.count("\n") > MAX_FILE_LINES:
            too_long.append(f"{path}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _function_lines(node) > MAX_FUNCTION_LINES:
                too_long.append(f"{path}: {node.name}() {_function_lines(node)} lines")
    assert not too_long


def test_the_scripts_hold_set_up_and_entries_not_framework_work():
    """What users run does its work in the framework (the commands of ``python -m embodied_async``);
    ``scripts/`` keeps set-up, the GPU check and thin entries: a few hundred lines of Python."""
    lines = {path: source.count("\n") for path, source in python_files("scripts")}
    assert lines and sum(lines.values()) <= 600, lines


def _imported_modules(source: str):
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_the_config_layer_imports_no_part_that_runs_the_graph():
    """Placement and topology are resolved in the config layer; the scheduler, the workers and the
    runners consume the resolved ``Topology`` and are never imported by it."""
    running = ("embodied_async.scheduler", "embodied_async.workers", "embodied_async.runner")
    found = {path: sorted(m for m in _imported_modules(source) if m.startswith(running))
             for path, source in framework_files() if path.startswith(os.path.join("embodied_async", "config"))}
    assert found and not {path: modules for path, modules in found.items() if modules}


def module_name(path: str) -> str:
    """``envs/maniskill/tasks.py`` -> ``envs.maniskill.tasks``; a package's ``__init__.py`` -> the package."""
    parts = path[: -len(".py")].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from ... import`` names, a relative one resolved against ``module``."""
    if not node.level:
        return node.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_names(path: str, source: str) -> Iterator[str]:
    """Every dotted name an import of the file reaches, at its top or inside a function:
    ``a.b`` for ``import a.b``, ``a.b.c`` for ``from a.b import c`` (``c`` a module or not)."""
    module, is_package = module_name(path), path.endswith("__init__.py")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _deepest_module(name: str, modules) -> str:
    """The longest prefix of ``name`` that is one of ``modules`` ("" if none: a third-party name)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def import_graph() -> Dict[str, Set[str]]:
    """Each module of ``PACKAGES`` -> the modules of ``PACKAGES`` it imports: the deepest module each
    import names (``from a.b import c``: ``a.b.c`` if it is a module, else ``a.b``). Parent packages
    an import also runs are not counted: a package's ``__init__`` re-exporting its modules is no cycle."""
    files = {module_name(path): (path, source) for path, source in python_files(*PACKAGES)}
    return {module: {_deepest_module(name, files) for name in imported_names(path, source)} - {"", module}
            for module, (path, source) in files.items()}


def _reachable(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    seen, todo = set(), list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen


def _cycle_through(graph: Dict[str, Set[str]], start: str) -> List[str]:
    """A shortest import path from ``start`` back to it (breadth first)."""
    paths, todo = {start: [start]}, deque([start])
    while todo:
        module = todo.popleft()
        for target in sorted(graph[module]):
            if target == start:
                return paths[module] + [start]
            if target not in paths:
                paths[target] = paths[module] + [target]
                todo.append(target)
    return []


def import_cycles(graph: Dict[str, Set[str]]) -> List[str]:
    """Each group of modules that import each other (directly or through others) as its shortest
    cycle through its first module and the whole group: ``a -> b -> a (group: a, b)``."""
    reach = {module: _reachable(graph, module) for module in graph}
    groups = {tuple(sorted(m for m in reach[module] if module in reach[m]))
              for module in graph if module in reach[module]}
    return sorted(f"{' -> '.join(_cycle_through(graph, group[0]))} (group: {', '.join(group)})" for group in groups)


def test_models_and_envs_never_import_each_other():
    crossing = sorted(f"{module} imports {target}" for module, targets in import_graph().items() for target in targets
                      if {module.split(".")[0], target.split(".")[0]} == {"models", "envs"})
    assert crossing == []


def test_no_modules_import_each_other_in_a_cycle():
    assert import_cycles(import_graph()) == []


def test_no_script_imports_another():
    """Scripts are thin: what two of them share lives in the framework, not in a script the other
    imports (nor on a ``sys.path`` that a script puts ``scripts/`` on)."""
    found = {}
    for folder in ("scripts", "benchmarks", os.path.join("examples", "embodiment")):
        scripts = {name[:-3] for name in os.listdir(os.path.join(REPO_ROOT, folder)) if name.endswith(".py")}
        for name in sorted(scripts):
            with open(os.path.join(REPO_ROOT, folder, f"{name}.py")) as f:
                source = f.read()
            imported = {module.split(".")[0] for module in _imported_modules(source)} & scripts
            if imported or re.search(r"sys\.path\.insert\(0, .*\"scripts\"", source):
                found[f"{folder}/{name}.py"] = sorted(imported) or ["scripts/ on sys.path"]
    assert found == {}
