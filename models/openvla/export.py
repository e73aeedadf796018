"""A trained OpenVLA policy in OpenVLA's own Hugging Face layout (``scripts/export.py``).

The folder holds what OpenVLA's code writes and reads: ``config.json`` whose ``norm_stats`` file
the action statistics the policy was trained with under the name the user gives, the weights in
the base checkpoint's dtype under the official tensor names (LoRA merged, one file or shards with
their index), ``generation_config.json``, ``preprocessor_config.json`` and the base checkpoint's
other files (tokenizer, processor, the remote code its ``auto_map`` names). The value head is
ours, not OpenVLA's: it is left out.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from embodied_async.export import ExportRequest, ExportResult
from models.vla import merge_lora

from .action_tokenizer import norm_stats_entry
from .modeling_openvla import weight_files
from .official_layout import generation_config, official_config, official_preprocessor

MAX_SHARD_SIZE = "5GB"  # what transformers' save_pretrained cuts weights into
REWRITTEN = ("config.json", "generation_config.json", "preprocessor_config.json")
NOT_COPIED = ("README.md", "model.safetensors.index.json", "dataset_statistics.json")
ACTION_FIELDS_OF_THE_DATA = ("min", "max", "mean", "std")


def export_openvla(request: ExportRequest) -> ExportResult:
    policy, folder, base = request.policy, request.folder, request.base_folder
    merged = merge_lora(policy.vla) if policy.lora_enabled else 0
    with open(os.path.join(base, "config.json")) as f:
        base_config = json.load(f)
    dtype = _stored_dtype(base)
    notes: List[str] = []
    config = official_config(base_config, str(dtype).removeprefix("torch."))
    config["norm_stats"] = {request.stats_key: _norm_stats_entry(policy, request, base_config, notes)}
    _write_json(folder, "config.json", config)
    generation = _base_json(base, "generation_config.json") or generation_config(config)
    _write_json(folder, "generation_config.json", generation)
    preprocessor = _base_json(base, "preprocessor_config.json")
    if preprocessor is not None:
        _write_json(folder, "preprocessor_config.json", official_preprocessor(preprocessor))
    _write_weights(policy.vla, folder, dtype)
    _copy_base_files(base, folder)
    if merged:
        notes.append(f"LoRA adapters of {merged} layers merged into the weights")
    if policy.value_head is not None:
        notes.append("the value head (ours, not OpenVLA's) is left out: the export acts, it does not train on")
    if not any(os.path.isfile(os.path.join(folder, n)) for n in ("tokenizer.model", "tokenizer.json")):
        notes.append("no tokenizer: the base checkpoint had none (copy the Llama-2 tokenizer files of "
                     "openvla/openvla-7b here before loading it with AutoProcessor)")
    if not os.path.isfile(os.path.join(folder, "modeling_prismatic.py")):
        notes.append("no remote code: the base checkpoint had none (copy configuration_prismatic.py, "
                     "modeling_prismatic.py and processing_prismatic.py of openvla/openvla-7b here for "
                     "trust_remote_code, or load it with the classes of OpenVLA's repository)")
    return ExportResult(format="OpenVLA (Hugging Face)", load_with=_load_with(request.stats_key), notes=notes)


def _norm_stats_entry(policy, request: ExportRequest, base_config: Dict[str, Any], notes: List[str]) -> Dict:
    """The base's entry for the policy's statistics, with the q01 / q99 / mask the policy acts
    with; min / max / mean / std / counts from the SFT dataset when the policy's range came from
    one, dropped (and said) when they cannot be known."""
    base_entry = norm_stats_entry(base_config.get("norm_stats") or {}, request.model_cfg.unnorm_key)
    entry = json.loads(json.dumps(base_entry))  # a deep copy of plain data
    stats = policy.action_stats
    action = entry.setdefault("action", {})
    same_range = all(np.allclose(np.asarray(action.get(k, np.nan), dtype=np.float64), stats[k]) for k in ("q01", "q99"))
    action.update(q01=stats["q01"].tolist(), q99=stats["q99"].tolist(), mask=stats["mask"].astype(bool).tolist())
    if same_range:
        return entry
    data = (request.dataset_stats or {}).get("actions")
    if data is not None:
        action.update({k: np.asarray(data[k], dtype=np.float64).reshape(-1).tolist()
                       for k in ACTION_FIELDS_OF_THE_DATA})
        entry.update(num_trajectories=request.dataset_episodes, num_transitions=request.dataset_frames)
        return entry
    for key in ACTION_FIELDS_OF_THE_DATA:
        action.pop(key, None)
    notes.append("norm_stats: the action range came from a dataset that is no longer where its run read it, so "
                 "only q01 / q99 / mask (what OpenVLA un-normalises with) are written")
    return entry


def _stored_dtype(base: str) -> torch.dtype:
    """The dtype the base checkpoint stores its floating weights in (the export keeps it)."""
    with safe_open(weight_files(base)[0], framework="pt") as f:
        for key in f.keys():
            tensor = f.get_slice(key)
            dtype = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}.get(tensor.get_dtype())
            if dtype is not None:
                return dtype
    return torch.float32


def _write_weights(vla, folder: str, dtype: torch.dtype) -> List[str]:
    """The model's tensors (official names) in ``dtype``: ``model.safetensors``, or shards of at
    most 5 GB and ``model.safetensors.index.json`` as transformers writes them."""
    from huggingface_hub import split_torch_state_dict_into_shards

    state = {k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous()
             for k, v in vla.state_dict().items()}
    split = split_torch_state_dict_into_shards(state, max_shard_size=MAX_SHARD_SIZE)
    for filename, names in split.filename_to_tensors.items():
        save_file({name: state[name] for name in names}, os.path.join(folder, filename), metadata={"format": "pt"})
    files = list(split.filename_to_tensors)
    if split.is_sharded:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                 "weight_map": split.tensor_to_filename}
        _write_json(folder, "model.safetensors.index.json", index)
        files.append("model.safetensors.index.json")
    return files


def _copy_base_files(base: str, folder: str) -> List[str]:
    """The base checkpoint's other files (tokenizer, processor, remote code, ...), not its weights."""
    copied = []
    for name in sorted(os.listdir(base)):
        path = os.path.join(base, name)
        weights = name.endswith((".safetensors", ".bin", ".pt")) or name.startswith("pytorch_model")
        if os.path.isfile(path) and not name.startswith(".") and not weights and name not in REWRITTEN + NOT_COPIED:
            shutil.copyfile(path, os.path.join(folder, name))
            copied.append(name)
    return copied


def _base_json(base: str, name: str) -> Optional[Dict[str, Any]]:
    path = os.path.join(base, name)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _write_json(folder: str, name: str, content: Dict[str, Any]) -> None:
    """As transformers writes its JSON files: indented by 2, keys sorted, a final newline."""
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        f.write(json.dumps(content, indent=2, sort_keys=True) + "\n")


def _load_with(key: str) -> str:
    return f"""With OpenVLA's own code (its repository pins transformers 4.40.1; the folder's `auto_map` names the
remote code):

```python
import torch
from PIL import Image
from transformers import AutoModelForVision2Seq, AutoProcessor

processor = AutoProcessor.from_pretrained("<this folder or repo id>", trust_remote_code=True)
vla = AutoModelForVision2Seq.from_pretrained("<this folder or repo id>", torch_dtype=torch.bfloat16,
                                             trust_remote_code=True).to("cuda:0")
prompt = "In: What action should the robot take to <instruction>?\\nOut:"
inputs = processor(prompt, Image.open("frame.png")).to("cuda:0", dtype=torch.bfloat16)
action = vla.predict_action(**inputs, unnorm_key="{key}", do_sample=False)
```

Here: `model.path=<this folder>` (e.g. `scripts/eval.py <this folder> --recipe <recipe>`, or as the base of
another run) with `model.unnorm_key={key}`."""
