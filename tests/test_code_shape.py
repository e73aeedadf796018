"""The framework stays small and generic: it names no policy or env family, and its files and
functions stay short enough to read (docstrings and comments excluded)."""

import ast
import os
import re

from conftest import REPO_ROOT

FRAMEWORK = os.path.join(REPO_ROOT, "embodied_async")
FAMILY_NAMES = re.compile(r"openvla|maniskill|mujoco|cnn|mlp|pi0", re.IGNORECASE)
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 60


def framework_files():
    for folder, _, files in os.walk(FRAMEWORK):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    yield os.path.relpath(path, REPO_ROOT), f.read()


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
    found = {path: sorted(set(FAMILY_NAMES.findall(code_without_docs(source))))
             for path, source in framework_files()}
    assert not {path: names for path, names in found.items() if names}


def test_files_and_functions_stay_short():
    too_long = []
    for path, source in framework_files():
        if source.count("\n") > MAX_FILE_LINES:
            too_long.append(f"{path}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = _docstring(node)
                lines = node.end_lineno - node.lineno + 1
                if doc is not None:
                    lines -= doc.end_lineno - doc.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{path}: {node.name}() {lines} lines")
    assert not too_long


def _imported_modules(source: str):
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_the_config_layer_imports_no_part_that_runs_the_graph():
    """Placement and topology are resolved in the config layer; the scheduler, the workers and the
    runners consume the resolved ``Topology`` and are never imported by it."""
    running = ("embodied_async.scheduler", "embodied_async.workers", "embodied_async.runner",
               "embodied_async.sft_runner")
    found = {path: sorted(m for m in _imported_modules(source) if m.startswith(running))
             for path, source in framework_files() if path.startswith(os.path.join("embodied_async", "config"))}
    assert found and not {path: modules for path, modules in found.items() if modules}
