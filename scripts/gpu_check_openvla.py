"""Rollout and training speed and peak memory of the OpenVLA policy; prints one JSON object.

    .venv/bin/python scripts/gpu_check_openvla.py --shape 7b --batch 8           # random 7B weights
    .venv/bin/python scripts/gpu_check_openvla.py --path openvla/openvla-7b      # a real checkpoint
    .venv/bin/python scripts/gpu_check_openvla.py --shape tiny --steps 2         # CPU smoke run

Rollout: actions/s of batched ``predict`` (KV-cached generation of the action tokens, sampling).
Training: samples/s of ``evaluate`` + backward + optimiser step (LoRA adapters and value head when
--lora-rank > 0), with gradient checkpointing on for the 7B shape. Peak memory is the CUDA
allocator's peak on a GPU, the process's peak resident set on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from models.openvla import OpenVLAConfig, OpenVLAModel, OpenVLAPolicy, make_tiny_openvla  # noqa: E402
from models.openvla.policy_openvla import resolve_checkpoint  # noqa: E402
from models.openvla.tiny import tiny_config_dict  # noqa: E402

# the Llama-2-7B language model of the released OpenVLA-7B (its ViTs follow from the timm ids)
LLAMA2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32}


def build_policy(args, device: torch.device, dtype: torch.dtype) -> OpenVLAPolicy:
    lora = dict(lora_rank=args.lora_rank, lora_alpha=args.lora_rank or 32,
                gradient_checkpointing=args.shape == "7b" or args.path is not None)
    if args.path:
        return OpenVLAPolicy.from_pretrained(resolve_checkpoint(args.path), dtype=dtype,
                                             unnorm_key=args.unnorm_key, **lora).to(device)
    if args.shape == "tiny":
        folder = make_tiny_openvla(tempfile.mkdtemp(prefix="tiny_openvla_"))
        return OpenVLAPolicy.from_pretrained(folder, dtype=dtype, **lora).to(device)
    raw = tiny_config_dict()
    raw["text_config"].update(LLAMA2_7B)
    with torch.device(device):  # random weights straight on the device: no 7B copy on the host
        vla = OpenVLAModel(OpenVLAConfig.from_dict(raw)).to(dtype)
    return OpenVLAPolicy(vla, unnorm_key="tiny", **lora).to(device)


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def timed(fn, steps: int, device: torch.device) -> float:
    fn()  # warm-up (kernels, caches)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", help="checkpoint folder or Hugging Face repo id (default: random weights)")
    parser.add_argument("--shape", choices=("7b", "tiny"), default="7b" if torch.cuda.is_available() else "tiny")
    parser.add_argument("--unnorm-key", default=None)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    policy = build_policy(args, device, dtype)
    rng = np.random.default_rng(0)
    obs = {"main_images": rng.integers(0, 256, (args.batch, 224, 224, 3), dtype=np.uint8),
           "task_descriptions": ["put the carrot on the plate"] * args.batch}

    policy.eval()
    rollout_s = timed(lambda: policy.predict(obs, mode="train"), args.steps, device)
    batch = policy.predict(obs, mode="train")
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)

    def train_step():
        logprobs, entropy, values = policy.evaluate(batch.forward_inputs, batch.actions)
        (-(logprobs.float().mean()) + values.float().pow(2).mean()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    policy.train()
    train_s = timed(train_step, args.steps, device)
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": "checkpoint" if args.path else args.shape, "dtype": str(dtype).replace("torch.", ""),
        "batch": args.batch, "steps": args.steps, "lora_rank": args.lora_rank,
        "parameters": sum(p.numel() for p in policy.parameters()), "trainable_parameters": sum(
            p.numel() for p in trainable),
        "rollout_actions_per_s": round(args.batch * args.steps / rollout_s, 2),
        "train_samples_per_s": round(args.batch * args.steps / train_s, 2),
        "peak_memory_gb": round(peak_memory_gb(device), 3),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
