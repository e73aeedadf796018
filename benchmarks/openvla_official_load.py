"""Load an exported OpenVLA folder with OpenVLA's own Hugging Face classes and print the action
tokens its forward pass chooses, for comparison with our policy's (benchmarks/2026-12-05-export-official-load.md).

Runs in a Python environment of its own, as OpenVLA pins it (transformers 4.40.1, tokenizers 0.19.1,
timm 0.9.10, numpy < 2), with OpenVLA's ``prismatic/extern/hf/*.py`` copied into a package folder:

    python benchmarks/openvla_official_load.py EXPORT_DIR UNNORM_KEY INPUTS.json OUT.json --hf-code DIR

INPUTS.json: {"images": uint8 [N, H, W, 3] as lists, "prompt_ids": N lists of token ids}. The
tokens are chosen greedily among the 256 action tokens, the rule our policy acts by (OpenVLA's
``predict_action`` takes the greedy token over the whole vocabulary, which for a tiny random model
is often not an action token); ``predict_action``'s actions are written too.
"""

import argparse
import json
import sys

import numpy as np
import torch

ACTION_TOKENS = (32000 - 256, 32000)


def declare_torchvision_ops() -> None:
    """The CPU torch wheel has no torchvision ops; torchvision's import registers kernels for these
    two, so their schemas must exist first (nothing here runs them)."""
    library = torch.library.Library("torchvision", "DEF")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    return library


def shrink_vits(folder: str, modeling) -> None:
    """Tiny checkpoints: OpenVLA derives ViT sizes from the timm ids; vision_overrides.json gives
    the tiny ones, passed to its timm.create_model calls."""
    try:
        with open(f"{folder}/vision_overrides.json") as f:
            overrides = json.load(f)["timm_create_model_extra_kwargs"]
    except FileNotFoundError:
        return
    create = modeling.timm.create_model
    modeling.timm.create_model = lambda name, *a, **kw: create(name, *a, **{**kw, **overrides.get(name, {})})


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("folder", "unnorm_key", "inputs", "out"):
        parser.add_argument(name)
    parser.add_argument("--hf-code", required=True, help="a folder holding OpenVLA's prismatic/extern/hf files as a "
                                                         "package named refpkg")
    args = parser.parse_args()
    library = declare_torchvision_ops()  # noqa: F841  (kept alive while torchvision is imported)
    sys.path.insert(0, args.hf_code)
    from PIL import Image
    from refpkg import modeling_prismatic
    from refpkg.configuration_prismatic import OpenVLAConfig
    from refpkg.processing_prismatic import PrismaticImageProcessor

    shrink_vits(args.folder, modeling_prismatic)
    torch.set_num_threads(1)
    config = OpenVLAConfig.from_pretrained(args.folder)
    model, info = modeling_prismatic.OpenVLAForActionPrediction.from_pretrained(
        args.folder, config=config, output_loading_info=True, attn_implementation="sdpa")
    model.eval()
    processor = PrismaticImageProcessor.from_pretrained(args.folder)
    with open(args.inputs) as f:
        data = json.load(f)
    action_dim = len(config.norm_stats[args.unnorm_key]["action"]["q01"])
    tokens, actions = [], []
    for image, ids in zip(np.array(data["images"], dtype=np.uint8), data["prompt_ids"]):
        pixels = processor(Image.fromarray(image), return_tensors="pt")["pixel_values"]
        sequence = list(ids) + ([29871] if ids[-1] != 29871 else [])
        chosen = []
        with torch.no_grad():
            for _ in range(action_dim):
                logits = model(input_ids=torch.tensor([sequence]), pixel_values=pixels,
                               attention_mask=torch.ones(1, len(sequence), dtype=torch.long)).logits
                chosen.append(ACTION_TOKENS[0] + int(logits[0, -1, slice(*ACTION_TOKENS)].argmax()))
                sequence.append(chosen[-1])
            prompt = torch.tensor([ids])
            actions.append(model.predict_action(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                                pixel_values=pixels, unnorm_key=args.unnorm_key,
                                                do_sample=False).tolist())
        tokens.append(chosen)
    report = {"loading_info": {k: list(v) for k, v in info.items()}, "action_tokens": tokens,
              "predict_action": actions}
    with open(args.out, "w") as f:
        json.dump(report, f)
    print(json.dumps({"loading_info": {k: len(v) for k, v in info.items()}, "action_tokens": tokens}))


if __name__ == "__main__":
    main()
