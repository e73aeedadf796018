"""``export``: a checkpoint of a run in its policy family's own published format, with a model card.

    python -m embodied_async export CHECKPOINT --out DIR [--stats-key NAME] [--overwrite] [--push-to-hub REPO_ID]

CHECKPOINT is one of our checkpoints (``<log>/checkpoints/global_step_<N>``, PPO or SFT, with or
without LoRA): OpenVLA goes out in OpenVLA's Hugging Face layout, Pi0 in LeRobot's policy layout,
the MLP and CNN policies as safetensors + config.json (``model.path`` loads each back). The
action statistics are filed under ``--stats-key`` (OpenVLA's ``unnorm_key``; default: the task).
``--push-to-hub`` uploads the finished folder (private; the token from ``hf auth login`` or
``HF_TOKEN``). Exit code 2 on bad input, with one line naming the problem.
"""

from __future__ import annotations

import argparse
import os

from embodied_async.cli.errors import report


def export_command(argv=None) -> int:
    from embodied_async.export import export_checkpoint
    from embodied_async.hub import push_and_report

    args = _parse(argv)
    try:
        result = export_checkpoint(args.checkpoint, args.out, args.stats_key, args.overwrite)
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 (the table decides: a bug keeps its traceback)
        return report(err, "export", note="nothing was written to --out" if isinstance(err, KeyboardInterrupt) else "")
    print(f"[export] {result.format} written to {args.out}: {', '.join(sorted(os.listdir(args.out)))}", flush=True)
    for note in result.notes:
        print(f"[export] note: {note}", flush=True)
    if args.push_to_hub:
        return push_and_report(args.out, args.push_to_hub, "model", not args.public, "export")
    return 0


def _parse(argv):
    from embodied_async.hub import add_push_arguments

    parser = argparse.ArgumentParser(prog="python -m embodied_async export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a run's checkpoint folder (<log>/checkpoints/global_step_<N>)")
    parser.add_argument("--out", required=True, help="the folder to write (new or empty, or with --overwrite)")
    parser.add_argument("--stats-key", default=None,
                        help="the name the action statistics are filed under (the unnorm_key a model names them by; "
                             "default: the task)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it holds files")
    add_push_arguments(parser, "model")
    return parser.parse_args(argv)
