"""The files of a checkpoint as OpenVLA's own code writes it (its Hugging Face classes, under the
transformers 4.40.1 it pins): which fields ``config.json``, ``generation_config.json`` and
``preprocessor_config.json`` hold, with the values that code writes where a checkpoint of ours
leaves them out (the tiny checkpoints write only what our loader reads).

Only format facts live here; ``export.py`` fills a checkpoint's files from them.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

TRANSFORMERS_VERSION = "4.40.1"  # the version OpenVLA pins; its to_dict writes the fields below

# every field transformers 4.40's configuration base class writes, with its default
PRETRAINED_CONFIG_DEFAULTS: Dict[str, Any] = {
    "_name_or_path": "", "add_cross_attention": False, "architectures": None, "bad_words_ids": None,
    "begin_suppress_tokens": None, "bos_token_id": None, "chunk_size_feed_forward": 0,
    "cross_attention_hidden_size": None, "decoder_start_token_id": None, "diversity_penalty": 0.0,
    "do_sample": False, "early_stopping": False, "encoder_no_repeat_ngram_size": 0, "eos_token_id": None,
    "exponential_decay_length_penalty": None, "finetuning_task": None, "forced_bos_token_id": None,
    "forced_eos_token_id": None, "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "is_decoder": False,
    "is_encoder_decoder": False, "label2id": {"LABEL_0": 0, "LABEL_1": 1}, "length_penalty": 1.0,
    "max_length": 20, "min_length": 0, "no_repeat_ngram_size": 0, "num_beam_groups": 1, "num_beams": 1,
    "num_return_sequences": 1, "output_attentions": False, "output_hidden_states": False, "output_scores": False,
    "pad_token_id": None, "prefix": None, "problem_type": None, "pruned_heads": {}, "remove_invalid_values": False,
    "repetition_penalty": 1.0, "return_dict": True, "return_dict_in_generate": False, "sep_token_id": None,
    "suppress_tokens": None, "task_specific_params": None, "temperature": 1.0, "tf_legacy_loss": False,
    "tie_encoder_decoder": False, "tie_word_embeddings": True, "tokenizer_class": None, "top_k": 50, "top_p": 1.0,
    "torch_dtype": None, "torchscript": False, "typical_p": 1.0, "use_bfloat16": False,
}

# the fields OpenVLA's own config class adds at the top level
OPENVLA_CONFIG_DEFAULTS: Dict[str, Any] = {
    "output_projector_states": False,
    "auto_map": {"AutoConfig": "configuration_prismatic.OpenVLAConfig",
                 "AutoModelForVision2Seq": "modeling_prismatic.OpenVLAForActionPrediction"},
    "architectures": ["OpenVLAForActionPrediction"],
}

# the fields the Llama config adds to the base class's (text_config)
LLAMA_CONFIG_DEFAULTS: Dict[str, Any] = {
    "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "pretraining_tp": 1,
    "use_cache": True, "rope_scaling": None,
}

# generation_config.json as transformers 4.40 derives it from the model config
GENERATION_CONFIG_DEFAULTS: Dict[str, Any] = {
    "_from_model_config": True, "bad_words_ids": None, "begin_suppress_tokens": None, "cache_implementation": None,
    "constraints": None, "decoder_start_token_id": None, "diversity_penalty": 0.0, "do_sample": False,
    "early_stopping": False, "encoder_no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "exponential_decay_length_penalty": None, "force_words_ids": None,
    "forced_bos_token_id": None, "forced_decoder_ids": None, "forced_eos_token_id": None, "generation_kwargs": {},
    "guidance_scale": None, "length_penalty": 1.0, "low_memory": None, "max_length": 20,
    "max_matching_ngram_size": None, "max_new_tokens": None, "max_time": None, "min_length": 0,
    "min_new_tokens": None, "no_repeat_ngram_size": 0, "num_assistant_tokens": 5,
    "num_assistant_tokens_schedule": "heuristic", "num_beam_groups": 1, "num_beams": 1, "num_return_sequences": 1,
    "output_attentions": False, "output_hidden_states": False, "output_logits": None, "output_scores": False,
    "penalty_alpha": None, "prompt_lookup_num_tokens": None, "remove_invalid_values": False,
    "renormalize_logits": False, "repetition_penalty": 1.0, "return_dict_in_generate": False, "sequence_bias": None,
    "suppress_tokens": None, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "typical_p": 1.0, "use_cache": True,
}

# PIL's resampling codes, which the processor's resize parameters store
PIL_FILTERS = {"nearest": 0, "bilinear": 2, "bicubic": 3}


def official_config(config: Dict[str, Any], dtype: str) -> Dict[str, Any]:
    """``config.json`` with every field the official classes write (the base's values kept)."""
    text = {**PRETRAINED_CONFIG_DEFAULTS, **LLAMA_CONFIG_DEFAULTS, **config["text_config"], "torch_dtype": dtype}
    out = {**PRETRAINED_CONFIG_DEFAULTS, **OPENVLA_CONFIG_DEFAULTS, **config, "text_config": text,
           "torch_dtype": dtype, "transformers_version": config.get("transformers_version", TRANSFORMERS_VERSION)}
    return out


def generation_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """``generation_config.json`` derived from the model config (greedy; the LLM's special ids)."""
    text = config["text_config"]
    return {**GENERATION_CONFIG_DEFAULTS, "bos_token_id": text.get("bos_token_id"),
            "eos_token_id": text.get("eos_token_id"), "pad_token_id": text.get("pad_token_id"),
            "transformers_version": config.get("transformers_version", TRANSFORMERS_VERSION)}


def _float32(values) -> List[float]:
    """The processor computes its constants in float32; JSON shows their float64 expansion."""
    return [float(v) for v in np.asarray(values, dtype=np.float32)]


def official_preprocessor(preprocessor: Dict[str, Any]) -> Dict[str, Any]:
    """``preprocessor_config.json`` with the resolved transform parameters (``tvf_*``) the official
    processor writes, derived from the strategy, sizes, filters and constants when absent."""
    out = {"_processor_class": None, **preprocessor}
    sizes = [list(s) for s in out["input_sizes"]]
    strategy = out["image_resize_strategy"]
    filters = [PIL_FILTERS[name] for name in out["interpolations"]]
    # resize-crop resizes the shorter side, then crops; the other strategies resize to the square
    resized = [size[-1] if strategy == "resize-crop" else [size[-1], size[-1]] for size in sizes]
    out.setdefault("tvf_resize_params", [{"antialias": True, "interpolation": code, "max_size": None, "size": size}
                                         for code, size in zip(filters, resized)])
    out.setdefault("tvf_crop_params", [{"output_size": size[1:]} for size in sizes])
    out.setdefault("tvf_normalize_params", [{"inplace": False, "mean": _float32(mean), "std": _float32(std)}
                                            for mean, std in zip(out["means"], out["stds"])])
    out.setdefault("tvf_do_letterbox", strategy == "letterbox")
    # the letterbox fill comes from the last backbone's means, as the official processor takes it
    out.setdefault("tvf_letterbox_fill", [int(255 * m) for m in out["means"][-1]] if strategy == "letterbox" else None)
    return out
