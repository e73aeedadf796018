"""ARCHITECTURE.md is the whole map: it names every framework file, only files that exist, the
rows a newcomer looks for, and nothing outside the repository."""

import os
import re

from conftest import REPO_ROOT

FRAMEWORK = os.path.join(REPO_ROOT, "embodied_async")
SEARCHED = ("embodied_async", "models", "envs", "scripts", "examples", "benchmarks", "tests")


def architecture() -> str:
    with open(os.path.join(REPO_ROOT, "ARCHITECTURE.md")) as f:
        return f.read()


def named_files(text: str):
    """Every ``name.py`` or ``path/name.py`` the text names inside backticks (fenced blocks aside)."""
    for quoted in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
        yield from re.findall(r"[\w/]+\.py\b", quoted)


def exists(name: str) -> bool:
    if os.path.isfile(os.path.join(REPO_ROOT, name)) or os.path.isfile(os.path.join(FRAMEWORK, name)):
        return True
    base = os.path.basename(name)
    return any(base in files for top in SEARCHED for _, _, files in os.walk(os.path.join(REPO_ROOT, top)))


def test_every_framework_file_is_named():
    text = architecture()
    names = set(named_files(text))
    bases = {os.path.basename(name) for name in names}
    missing = []
    for folder, _, files in os.walk(FRAMEWORK):
        for name in files:
            if name.endswith(".py") and name != "__init__.py" and name not in bases:
                missing.append(os.path.relpath(os.path.join(folder, name), REPO_ROOT))
    assert missing == []


def test_every_file_it_names_exists_and_it_points_nowhere_outside():
    text = architecture()
    assert [name for name in set(named_files(text)) if not exists(name)] == []
    assert "../shared" not in text and "DESIGN.md" not in text


def test_it_has_the_rows_a_newcomer_looks_for():
    text = architecture()
    for row in ("add a training mode", "checkpoint format", "evaluated", "train_async.py"):
        assert row in text, row


def test_every_family_declares_its_config_where_the_map_says():
    """``configuration_<package>.py``, or ``configuration_policy.py`` beside a checkpoint's own
    ``configuration_<family>.py``."""
    from embodied_async.registry import families

    misplaced = []
    for section in ("model", "env"):
        for name, cls in families(section).items():
            if not cls.__module__.startswith(("models.", "envs.")):  # a test's own family
                continue
            package, module = cls.__module__.split(".")[-2:]
            beside_checkpoint_config = module == "configuration_policy" and os.path.isfile(
                os.path.join(REPO_ROOT, *cls.__module__.split(".")[:-1], f"configuration_{name}.py"))
            if module != f"configuration_{package}" and not beside_checkpoint_config:
                misplaced.append(f"{section} {name}: {cls.__module__}")
    assert misplaced == []


def test_it_draws_the_path_from_the_command_to_the_first_gradient_in_at_most_four_files():
    text = architecture()
    section = text.split("### From the command to the first gradient", 1)[1].split("\n## ", 1)[0]
    steps = re.findall(r"^\d+\. (\S+\.py)", section, flags=re.M)
    assert 1 <= len(steps) <= 4 and steps[0] == "embodied_async/cli/train.py" and steps[-1].endswith("ppo.py")
    assert all(os.path.isfile(os.path.join(REPO_ROOT, step)) for step in steps)
    assert "backward" in section
