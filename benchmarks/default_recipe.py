"""The default recipe's learning efficiency, guarded: how many env steps and training seconds it
takes until an evaluation first reaches 0.9, and its wall rate, measured on this code and on a
reference commit's, one after the other on this machine. A change to
``embodied_async/algorithms/``, the workers, the runner or the default recipe quotes this
benchmark in its note.

Each run is the README's main job with a seed and a stop, as a user types it:

    bash scripts/run_async.sh runner.seed=S runner.stop_at_eval_success=0.9 runner.max_steps=400

(evaluation every 10 updates beside training, 32 deterministic episodes). Codes alternate per seed
(seed k of every code before seed k + 1 of any, the first of them alternating too), so the
machine's drift and the order within a pair fall on all of them alike. A reference commit's code
is taken out of git (``git archive``) into the output folder and runs with this checkout's Python
environment; its runs are otherwise the same command.

Reported per code: per seed the env steps, training seconds and updates at the stop, the env
steps/s over the run and the PPO epochs per update; their means; and for this code against each
reference the ratios of means with paired bootstrap 95 % intervals (env steps: learning per
sample; env steps/s: the wall rate; seconds: both). The stored figures
(``benchmarks/default-recipe-reference.json``) add the env steps a reference needed on other
machines: env steps carry over between machines (up to float rounding), seconds do not.

First, unless ``--same-learning 0``, a check that needs no statistics: the deterministic graph
(one env process, ``algorithm.staleness_threshold=0``, evaluations paused; a run of it repeats to
the last bit) trains ``--same-learning`` updates on each code, and every learning figure of every
update (losses, KLs, epochs, returns, evaluations) is compared exactly. Identical figures mean the
two codes learn alike, so a gap in the async runs' env steps is the seeds' noise; otherwise the
report names the first update and the figures that differ (what ``git bisect`` can then look for).

Each finished run is kept (``<out>/runs/<code>_seed<k>.json``): the same command with the same
``--out`` does only what is missing, so Ctrl-C or a crash loses at most the run in flight.

    .venv/bin/python benchmarks/default_recipe.py                    # seeds 1-4, ~20 min on 2 cores
    .venv/bin/python benchmarks/default_recipe.py --seeds 1 2 3 4 5 6 7 8 --record benchmarks
    # a change against its parent, recorded beside the day's other records:
    .venv/bin/python benchmarks/default_recipe.py --against HEAD~3 --record benchmarks --label issue47
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tarfile
import time
from typing import Dict, List, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from embodied_async import records  # noqa: E402
from embodied_async.metrics import read_metrics  # noqa: E402
from embodied_async.seed_statistics import ratio_of_means  # noqa: E402

RECIPE = "maniskill_async_ppo_mlp"
TARGET = 0.9
MAX_STEPS = 400
THIS_CODE = "this"  # the checkout the script runs from, with its uncommitted changes
REFERENCE_FILE = os.path.join(REPO_ROOT, "benchmarks", "default-recipe-reference.json")
RATIOS = (("env_steps", "env steps to 0.9"), ("train_s", "training seconds to 0.9"),
          ("env_steps_per_s", "env steps/s"))


# ---- one run ---------------------------------------------------------------------------------------
def run_command(seed: int) -> List[str]:
    """The main job with a seed and a stop (``scripts/run_async.sh`` less its set-up step)."""
    return [sys.executable, "examples/embodiment/train_async.py", "--config-name", RECIPE, f"runner.seed={seed}",
            f"runner.stop_at_eval_success={TARGET}", f"runner.max_steps={MAX_STEPS}"]


def code_tree(code: str, out_dir: str) -> str:
    """Where ``code``'s files are: this checkout, or a commit's files taken out of git once."""
    if code == THIS_CODE:
        return REPO_ROOT
    tree = os.path.join(out_dir, "code", code)
    if not os.path.isfile(os.path.join(tree, ".complete")):
        os.makedirs(tree, exist_ok=True)
        archive = tree + ".tar"
        with open(archive, "wb") as f:
            subprocess.run(["git", "-C", REPO_ROOT, "archive", "--format=tar", code], stdout=f, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        os.remove(archive)
        open(os.path.join(tree, ".complete"), "w").close()
        warn_if_other_dependencies(code, tree)
    return tree


def dependencies(tree: str) -> set:
    import tomllib

    with open(os.path.join(tree, "pyproject.toml"), "rb") as f:
        return set(tomllib.load(f).get("project", {}).get("dependencies", []))


def warn_if_other_dependencies(code: str, tree: str) -> None:
    """A commit's code runs in this checkout's environment: say so where it asked for another."""
    theirs, ours = dependencies(tree), dependencies(REPO_ROOT)
    if theirs != ours:
        print(f"[default-recipe] warning: {code[:7]} lists other dependencies than this checkout "
              f"(only it: {sorted(theirs - ours) or 'none'}; only this checkout: {sorted(ours - theirs) or 'none'}); "
              "its runs use this checkout's environment", flush=True)


def run_summary(records: List[Dict]) -> Dict:
    """What the guard compares, from a run's metric records: the env steps, training seconds and
    updates at the record whose evaluation first reached the target (where the run stopped), or at
    the last record if none did (``reached`` false: a lower bound), the rate over the run up to
    there and the mean PPO epochs per update."""
    trained = [r for r in records if "train_time_s" in r]
    if not trained:
        raise ValueError("the run wrote no training record")
    stop = next((r for r in trained if (r.get("eval/success_rate") or 0.0) >= TARGET), None)
    at = stop or trained[-1]
    upto = [r for r in trained if r["step"] <= at["step"]]
    epochs = [r["train/actor/epochs"] for r in upto if r.get("train/actor/epochs") is not None]
    return {"reached": stop is not None, "env_steps": int(at["env_steps"]),
            "train_s": round(float(at["train_time_s"]), 1), "updates": int(at["step"]),
            "env_steps_per_s": round(at["env_steps"] / max(at["train_time_s"], 1e-9), 1),
            "epochs_per_update": round(sum(epochs) / max(len(epochs), 1), 2),
            "eval_success": at.get("eval/success_rate")}


def launch(code: str, out_dir: str, name: str, command: List[str]) -> str:
    """Run ``command`` (its log folder ``<out>/logs/<name>``) in ``code``'s tree; the log folder."""
    tree = code_tree(code, out_dir)
    log_path = os.path.join(out_dir, "logs", name)
    subprocess.run(["rm", "-rf", log_path], check=True)
    env = dict(os.environ)
    if code != THIS_CODE:  # that code's packages before the editable install of this checkout's
        env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    with open(log_path + ".log", "w") as out:
        proc = subprocess.run([*command, f"runner.logger.log_path={log_path}"], cwd=tree, env=env, stdout=out,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"the run {name} failed (exit {proc.returncode}); its output: {log_path}.log")
    return log_path


def run_once(code: str, seed: int, out_dir: str) -> Dict:
    started = time.time()
    log_path = launch(code, out_dir, f"{code}_seed{seed}", run_command(seed))
    return {**run_summary(read_metrics(log_path)), "wall_s": round(time.time() - started, 1), "log_path": log_path}


# ---- the same learning: the deterministic graph, figure by figure ----------------------------------
DETERMINISTIC = ("cluster.component_placement.env=0", "algorithm.staleness_threshold=0",
                 "runner.eval_pauses_training=true", "runner.val_check_interval=10", "runner.save_interval=0")
# what a run of the deterministic graph repeats exactly: its learning, not its clocks, traffic or
# the counts taken at the moment the runner asks (env steps counted so far, the store's holdings)
TIMING = ("time/", "cpu/", "traffic/", "throughput/", "channel/", "train/rollout_store/", "wall_time_s",
          "train_time_s", "env_steps", "env/env_steps")


def learning_figures(records: List[Dict]) -> List[Dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]


def first_difference(mine: List[Dict], theirs: List[Dict]) -> Optional[Dict]:
    """The first update whose learning figures differ (compared over the figures both codes
    write; a figure only one of them writes is new, not different), or None."""
    for ours, other in zip(learning_figures(mine), learning_figures(theirs)):
        keys = sorted(k for k in set(ours) & set(other) if ours[k] != other[k])
        if keys:
            return {"update": ours.get("step"), "figures": keys[:12],
                    "values": {k: [ours[k], other[k]] for k in keys[:4]}}
    if len(mine) != len(theirs):
        return {"update": min(len(mine), len(theirs)) + 1, "figures": ["the number of records"], "values": {}}
    return None


def same_learning(codes: Sequence[str], updates: int, out_dir: str) -> Dict:
    """Each code's deterministic run of ``updates`` updates (``<out>/logs/same_learning/<code>``,
    kept for a rerun), compared with this code's."""
    command = [*run_command(1)[:-2], f"runner.max_steps={updates}", *DETERMINISTIC]
    os.makedirs(os.path.join(out_dir, "logs", "same_learning"), exist_ok=True)
    records = {}
    for code in codes:
        name = os.path.join("same_learning", code)
        records[code] = read_metrics(os.path.join(out_dir, "logs", name))
        if len(records[code]) != updates:
            print(f"[default-recipe] the deterministic graph, {updates} updates, on {code_name(code)} ...", flush=True)
            records[code] = read_metrics(launch(code, out_dir, name, command))
    return {code: {"updates": updates, "first_difference": first_difference(records[THIS_CODE], records[code])}
            for code in codes if code != THIS_CODE}


# ---- the comparison --------------------------------------------------------------------------------
def code_means(by_seed: Dict[int, Dict], seeds: Sequence[int]) -> Dict:
    done = [by_seed[s] for s in seeds if s in by_seed]
    mean = lambda key: round(sum(r[key] for r in done) / len(done), 1)  # noqa: E731
    return {"seeds": [s for s in seeds if s in by_seed], "not_reached": [s for s in seeds if s in by_seed
                                                                       and not by_seed[s]["reached"]],
            **{key: mean(key) for key in ("env_steps", "train_s", "updates", "env_steps_per_s",
                                          "epochs_per_update")}} if done else {}


def compare(runs: Dict[str, Dict[int, Dict]], seeds: Sequence[int]) -> Dict:
    """This code against each reference over the seeds both ran: the ratios of means with intervals."""
    out = {}
    for code, by_seed in runs.items():
        if code == THIS_CODE:
            continue
        paired = [s for s in seeds if s in by_seed and s in runs.get(THIS_CODE, {})]
        if paired:
            out[code] = {"seeds": paired, **{key: ratio_of_means([runs[THIS_CODE][s][key] for s in paired],
                                                                 [by_seed[s][key] for s in paired])
                                             for key, _ in RATIOS}}
    return out


def against_stored(runs: Dict[int, Dict], stored: Dict) -> Dict:
    """This code's env steps against each stored reference's, over the seeds both hold."""
    out = {}
    for name, reference in stored.get("references", {}).items():
        paired = [s for s in sorted(runs) if str(s) in reference["env_steps"]]
        if paired:
            out[name] = {"seeds": paired, "env_steps": ratio_of_means(
                [runs[s]["env_steps"] for s in paired], [reference["env_steps"][str(s)] for s in paired])}
    return out


def kept(path: str, compute) -> Dict:
    """``compute()``'s JSON result, stored at ``path`` whole or not at all; read back if there."""
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    result = compute()
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    return result


def same_learning_line(name: str, result: Dict) -> str:
    diff = result["first_difference"]
    if diff is None:
        return (f"the deterministic graph learns identically on this code and on {name}: every learning figure of "
                f"{result['updates']} updates equal")
    return (f"the deterministic graph learns differently on this code and on {name} from update {diff['update']} on: "
            f"{', '.join(diff['figures'])} (this code's, theirs: {diff['values']})")


def report_lines(report: Dict) -> List[str]:
    lines = [f"- {same_learning_line(report['names'][code], result)}" for code, result in
             report["same_learning"].items()]
    lines += ([""] if lines else []) + ["| code | seed | env steps | seconds | updates | env steps/s | epochs/update |",
                                        "| --- | --- | --- | --- | --- | --- | --- |"]
    for code, by_seed in report["runs"].items():
        for seed, r in by_seed.items():
            steps = f"{r['env_steps']:,}" + ("" if r["reached"] else " (not reached)")
            lines.append(f"| {report['names'][code]} | {seed} | {steps} | {r['train_s']} | {r['updates']} | "
                         f"{r['env_steps_per_s']} | {r['epochs_per_update']} |")
        m = report["means"].get(code)
        if m:
            lines.append(f"| **{report['names'][code]}** | mean | **{m['env_steps']:,.0f}** | **{m['train_s']}** | "
                         f"{m['updates']} | {m['env_steps_per_s']} | {m['epochs_per_update']} |")
    lines.append("")
    for code, ratios in report["ratios"].items():
        for key, label in RATIOS:
            r = ratios[key]
            lines.append(f"- this code / {report['names'][code]}, {label}: **{r['ratio']}** [{r['low']}, {r['high']}] "
                         f"(seeds {', '.join(map(str, ratios['seeds']))})")
    for name, ratios in report["against_stored"].items():
        r = ratios["env_steps"]
        lines.append(f"- this code / the stored figures of {name}, env steps to 0.9: **{r['ratio']}** "
                     f"[{r['low']}, {r['high']}] (seeds {', '.join(map(str, ratios['seeds']))})")
    return lines


def code_name(code: str) -> str:
    if code == THIS_CODE:
        head = git_output("rev-parse", "--short", "HEAD")
        return f"this checkout ({head}{'+changes' if git_output('status', '--porcelain', '-uno') else ''})"
    return git_output("rev-parse", "--short", code) or code


def git_output(*args: str) -> str:
    proc = subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def resolve_codes(against: Sequence[str], stored: Dict, parser) -> List[str]:
    """The commits to run beside this checkout, by full hash (the folder names of their runs)."""
    names = stored.get("compare_against", []) if against is None else [c for c in against if c != "none"]
    codes = []
    for name in names:
        full = git_output("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}")
        if not full:
            parser.error(f"--against {name}: no such commit in this repository (a shallow clone lacks old "
                         "commits: 'git fetch --unshallow', or --against none to compare with the stored figures)")
        codes.append(full)
    return codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--against", nargs="*", default=None, metavar="COMMIT",
                        help="commits whose code runs back to back with this checkout's (default: the stored "
                             "file's compare_against; 'none': only the stored figures)")
    parser.add_argument("--same-learning", type=int, default=40, metavar="UPDATES",
                        help="updates of the deterministic graph compared figure by figure first (0: skip)")
    parser.add_argument("--out", default=None, help="folder of the runs (default logs/default-recipe-<time>)")
    parser.add_argument("--record", default=None, metavar="DIR",
                        help="write DIR/<date>-default-recipe[-LABEL].json and .md")
    parser.add_argument("--label", default=None,
                        help="names the record (e.g. the issue), so a second record of the day keeps the first")
    args = parser.parse_args()

    with open(REFERENCE_FILE) as f:
        stored = json.load(f)
    codes = [THIS_CODE, *resolve_codes(args.against, stored, parser)]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = os.path.abspath(args.out or os.path.join(REPO_ROOT, "logs", f"default-recipe-{stamp}"))
    os.makedirs(os.path.join(out_dir, "runs"), exist_ok=True)
    print(f"[default-recipe] runs in {out_dir} (after a stop, the same command with --out {out_dir} goes on)",
          flush=True)
    names = {code: code_name(code) for code in codes}
    identical = same_learning(codes, args.same_learning, out_dir) if args.same_learning > 0 and len(codes) > 1 else {}
    for code, result in identical.items():
        print(f"[default-recipe] {same_learning_line(names[code], result)}", flush=True)
    runs: Dict[str, Dict[int, Dict]] = {code: {} for code in codes}
    for index, seed in enumerate(args.seeds):
        # which code runs first alternates from seed to seed: a run seemed to come out a few percent
        # faster second in a pair than first, and the order then falls on every code alike
        for code in (codes if index % 2 == 0 else codes[::-1]):
            path = os.path.join(out_dir, "runs", f"{code}_seed{seed}.json")
            if not os.path.isfile(path):
                print(f"[default-recipe] {names[code]}, seed {seed} ...", flush=True)
            runs[code][seed] = run = kept(path, lambda: run_once(code, seed, out_dir))
            print(f"[default-recipe] {names[code]}, seed {seed}: {run['env_steps']:,} env steps, {run['train_s']} s, "
                  f"{run['updates']} updates, {run['env_steps_per_s']} env steps/s"
                  + ("" if run["reached"] else f" (never reached {TARGET})"), flush=True)

    report = {"recipe": RECIPE, "command": " ".join(run_command(0)[1:]).replace("runner.seed=0", "runner.seed=S"),
              "date": datetime.date.today().isoformat(), "machine": machine(), "seeds": args.seeds, "names": names,
              "same_learning": identical,
              "runs": runs,
              "means": {code: code_means(runs[code], args.seeds) for code in codes},
              "ratios": compare(runs, args.seeds), "against_stored": against_stored(runs[THIS_CODE], stored)}
    lines = report_lines(report)
    print("\n".join(lines), flush=True)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    if args.record:
        write_record(report, lines, args, codes)
    print(f"[default-recipe] written to {out_dir}/report.json", flush=True)


def write_record(report: dict, lines: list, args, codes) -> None:
    """``--record``: the report as ``<date>-default-recipe[-<label>].json`` and ``.md`` there."""
    os.makedirs(args.record, exist_ok=True)
    stem = os.path.join(args.record, f"{report['date']}-default-recipe" + (f"-{args.label}" if args.label else ""))
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"# The default recipe to eval success {TARGET} ({report['date']})\n\nMachine: {report['machine']}."
                f"\n\n    .venv/bin/python {os.path.relpath(__file__, REPO_ROOT)} {invocation(args, codes)}\n\n"
                + "\n".join(lines) + "\n")
    print(f"[default-recipe] recorded {stem}.json and .md", flush=True)


def invocation(args, codes: Sequence[str]) -> str:
    """The flags that decide what a record holds: seeds, the commits compared, the deterministic check."""
    against = " ".join(codes[1:]) or "none"
    return (f"--seeds {' '.join(map(str, args.seeds))} --against {against} --same-learning {args.same_learning}"
            + (f" --label {args.label}" if args.label else ""))


def machine() -> str:
    here = records.machine()
    return f"{here['cores']} CPUs ({here['cpu']}), Python {here['python']}"


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("[default-recipe] stopped by Ctrl-C: the finished runs are kept; the same command with the same --out "
              "goes on from them", file=sys.stderr, flush=True)
        sys.exit(130)
    except RuntimeError as err:  # a run that failed: its log says why
        print(f"[default-recipe] error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
