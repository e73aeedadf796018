"""The README: its layout block names the repository's folders as they are, and it stays an
overview whose files exist."""

import glob
import os
import re
import subprocess

from conftest import REPO_ROOT


def layout_entries():
    """``{path: the text describing it}`` from the code block under '## Layout'."""
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        text = f.read()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    entries, current = {}, None
    for line in block.splitlines():
        if line and not line[0].isspace():
            current, _, description = line.partition(" ")
            entries[current] = description
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def ignored_by_git(name: str) -> bool:
    """What the README's own commands write beside the code (logs/, datasets/, exports/, the built
    manual) is git-ignored, and no part of the layout."""
    return subprocess.run(["git", "check-ignore", "-q", name], cwd=REPO_ROOT).returncode == 0


def test_the_layout_lists_every_top_level_folder_and_only_existing_ones():
    entries = layout_entries()
    listed = {path.split("/")[0] for path in entries}
    folders = {name for name in os.listdir(REPO_ROOT) if os.path.isdir(os.path.join(REPO_ROOT, name))
               and not name.startswith(".") and not name.endswith(".egg-info") and not ignored_by_git(name)}
    assert listed == folders
    assert [path for path in entries if not os.path.isdir(os.path.join(REPO_ROOT, path))] == []


def test_the_files_and_families_the_layout_names_exist():
    entries = layout_entries()
    files = {(path, name) for path, text in entries.items() for name in re.findall(r"\b[\w]+\.(?:py|sh)\b", text)}
    assert files and [f for f in files if not os.path.exists(os.path.join(REPO_ROOT, *f))] == []
    for path in ("models/", "envs/"):
        families = entries[path].split(":", 1)[1].split("(")[0]
        names = [name.strip() for name in families.split(",")]
        assert [n for n in names if not os.path.isdir(os.path.join(REPO_ROOT, path, n))] == [], path


def test_the_readme_is_an_overview_whose_named_files_exist():
    """At most 250 lines (the manual is docs/), and every file it names in backticks is there: a
    path from the repository's root, or a record of benchmarks/ by its name (a * a wildcard)."""
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        text = f.read()
    assert len(text.splitlines()) <= 250
    named = set(re.findall(r"`([\w./*{},-]+\.(?:md|py|sh|json|png|yaml))`", text))
    missing = [name for name in named if not any(glob.glob(os.path.join(REPO_ROOT, folder, name))
                                                 for folder in ("", "benchmarks"))]
    assert len(named) > 10 and missing == []


def test_every_manual_page_is_in_the_sites_navigation():
    """mkdocs warns of a page left out of mkdocs.yml's nav (scripts/test.sh builds with --strict),
    but the README's table of pages is checked here."""
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        listed = set(re.findall(r"\| `docs/([\w-]+\.md)` \|", f.read()))
    pages = {name for name in os.listdir(os.path.join(REPO_ROOT, "docs")) if name.endswith(".md")}
    assert listed == pages - {"index.md"}


def test_the_recipes_and_env_files_the_docs_name_exist():
    """Every ``env=<name>`` and every recipe a command in the README, the manual or a script's usage
    names is a file of configs/ (a renamed one would otherwise rot unseen); the how-tos' recipes too
    (their env names include a plugin's own)."""
    def texts(*patterns):
        for pattern in patterns:
            for source in glob.glob(pattern, root_dir=REPO_ROOT):
                with open(os.path.join(REPO_ROOT, source)) as f:
                    yield source, f.read()

    ours = ("README.md", "docs/*.md", "scripts/*.py", "scripts/*.sh")
    envs = {(source, name) for source, text in texts(*ours)
            for name in re.findall(r"(?<=\s)env=([a-z]\w*)(?=[\s`']|$)", text, re.M)}
    recipes = {(source, name) for source, text in texts(*ours, "examples/embodiment/*.md")
               for name in re.findall(r"run_async\.sh ([a-z]\w*)(?=[\s`']|$)", text, re.M)}
    assert len(envs) >= 2 and len(recipes) > 10
    missing = [(source, f"env/{name}") for source, name in envs
               if not os.path.isfile(os.path.join(REPO_ROOT, "configs", "env", f"{name}.yaml"))]
    missing += [(source, name) for source, name in recipes
                if not os.path.isfile(os.path.join(REPO_ROOT, "configs", f"{name}.yaml"))]
    assert missing == []
