"""OpenVLA action discretisation: continuous actions <-> action-bin token ids.

OpenVLA maps each normalised action dimension in [-1, 1] to one of ``n_bins`` uniform bins and
writes the bin as one of the last ``n_bins`` ids of the *unpadded* Llama-2 vocabulary (ids
31744..31999 for a 32000-word tokenizer padded to 32064 rows in the model). The rules here follow
the published reference behaviour (recorded in the golden fixtures' README):

- encode: clip to [min, max]; index = np.digitize(x, linspace(min, max, n_bins)) in 1..n_bins;
  token = base - index, where base = vocab_size - pad_to_multiple_of (the tokenizer's own size).
- decode: d = base - token; idx = clip(d - 1, 0, n_bins - 2); value = bin_centers[idx] (float64).
  Encode and decode are deliberately not exact inverses: there are n_bins edges but only
  n_bins - 1 centres, so the top edge index n_bins decodes to the last centre.
- unnormalise with the dataset's q01/q99 where ``mask`` is true, pass through elsewhere.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

import numpy as np


class ActionTokenizer:
    """Discretises normalised actions into OpenVLA action tokens and back.

    Args:
        vocab_size: the model's (padded) vocabulary size, e.g. ``text_config.vocab_size`` = 32064.
        pad_to_multiple_of: how many rows the model vocabulary was padded by; the tokenizer's
            own vocabulary is ``vocab_size - pad_to_multiple_of`` (32000 for Llama-2).
        n_bins: number of bin edges (OpenVLA: 256).
        min_action, max_action: range of the normalised actions.
    """

    def __init__(self, vocab_size: int, pad_to_multiple_of: int = 64, n_bins: int = 256,
                 min_action: float = -1.0, max_action: float = 1.0) -> None:
        if n_bins < 2:
            raise ValueError(f"n_bins must be >= 2, got {n_bins}")
        self.vocab_size = int(vocab_size)
        self.pad_to_multiple_of = int(pad_to_multiple_of)
        self.n_bins = int(n_bins)
        self.min_action, self.max_action = float(min_action), float(max_action)
        # Action ids count down from the end of the tokenizer's (unpadded) vocabulary.
        self.base_id = self.vocab_size - self.pad_to_multiple_of
        if self.base_id - self.n_bins < 0:
            raise ValueError(f"vocabulary {self.base_id} is too small for {self.n_bins} action bins")
        self.bins = np.linspace(self.min_action, self.max_action, self.n_bins)
        self.bin_centers = (self.bins[:-1] + self.bins[1:]) / 2.0

    @classmethod
    def from_config(cls, config: Any) -> "ActionTokenizer":
        """Builds from an OpenVLA config object or its ``config.json`` dict."""
        get = (lambda k, d=None: config.get(k, d)) if isinstance(config, Mapping) else \
            (lambda k, d=None: getattr(config, k, d))
        text_config = get("text_config")
        vocab = text_config.get("vocab_size") if isinstance(text_config, Mapping) else \
            getattr(text_config, "vocab_size")
        return cls(vocab, pad_to_multiple_of=get("pad_to_multiple_of", 64),
                   n_bins=get("n_action_bins", 256))

    def action_token_range(self) -> Tuple[int, int]:
        """Inclusive ``(low_id, high_id)`` of the ids that encode actions (31744, 31999 for OpenVLA)."""
        return self.base_id - self.n_bins, self.base_id - 1

    def is_action_token(self, token_ids: np.ndarray) -> np.ndarray:
        """Boolean array: which ids fall inside :meth:`action_token_range`."""
        low, high = self.action_token_range()
        ids = np.asarray(token_ids)
        return (ids >= low) & (ids <= high)

    def encode(self, normalized_actions: np.ndarray) -> np.ndarray:
        """Normalised actions (any shape) -> int64 token ids of the same shape."""
        clipped = np.clip(np.asarray(normalized_actions, dtype=np.float64), self.min_action, self.max_action)
        index = np.digitize(clipped, self.bins)  # 1..n_bins after clipping
        return (self.base_id - index).astype(np.int64)

    def bin_index(self, token_ids: np.ndarray) -> np.ndarray:
        """Token ids -> index into ``bin_centers`` (the reference's ``discretized_bin_index``).

        Ids outside the action range are clipped rather than rejected, as the reference does.
        """
        distance = self.base_id - np.asarray(token_ids, dtype=np.int64)
        return np.clip(distance - 1, 0, self.bin_centers.shape[0] - 1)

    def decode(self, token_ids: np.ndarray) -> np.ndarray:
        """Token ids (any shape) -> normalised actions (float64 bin centres), same shape."""
        return self.bin_centers[self.bin_index(token_ids)]

    @staticmethod
    def unnormalize(normalized: np.ndarray, stats: Mapping[str, Any]) -> np.ndarray:
        """Maps normalised actions back to the dataset's range with its q01/q99 statistics.

        ``stats`` is ``norm_stats[key]['action']``; dimensions whose ``mask`` is false (usually the
        gripper) are passed through unchanged. Broadcasts over leading batch dimensions; float64.
        """
        normalized = np.asarray(normalized, dtype=np.float64)
        low, high, mask = _bounds(stats, normalized.shape[-1])
        # Same operation order as the reference so results agree to the last bit.
        return np.where(mask, 0.5 * (normalized + 1) * (high - low) + low, normalized)

    @staticmethod
    def normalize(actions: np.ndarray, stats: Mapping[str, Any]) -> np.ndarray:
        """The inverse of ``unnormalize``: the q01..q99 range to [-1, 1], clipped there (as
        OpenVLA's data pipeline normalises its training actions); masked dimensions unchanged."""
        actions = np.asarray(actions, dtype=np.float64)
        low, high, mask = _bounds(stats, actions.shape[-1])
        scaled = np.clip(2 * (actions - low) / np.maximum(high - low, 1e-8) - 1, -1.0, 1.0)
        return np.where(mask, scaled, actions)

    def encode_actions(self, actions: np.ndarray, stats: Mapping[str, Any]) -> np.ndarray:
        """Un-normalised actions -> token ids (``normalize`` then ``encode``)."""
        return self.encode(self.normalize(actions, stats))

    def decode_actions(self, token_ids: np.ndarray, stats: Mapping[str, Any]) -> np.ndarray:
        """Token ids -> un-normalised float64 actions (``decode`` then ``unnormalize``)."""
        return self.unnormalize(self.decode(token_ids), stats)


def _bounds(stats: Mapping[str, Any], action_dim: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q01, q99, mask) of ``norm_stats[key]['action']``, checked against the action dim."""
    low = np.asarray(stats["q01"], dtype=np.float64)
    high = np.asarray(stats["q99"], dtype=np.float64)
    mask = np.asarray(stats.get("mask", np.ones_like(low, dtype=bool)), dtype=bool)
    if action_dim != low.shape[-1]:
        raise ValueError(f"action dim {action_dim} does not match stats dim {low.shape[-1]}")
    return low, high, mask


def get_action_stats(norm_stats: Mapping[str, Any], unnorm_key: Optional[str] = None) -> Mapping[str, Any]:
    """Returns ``norm_stats[unnorm_key]['action']`` (see :func:`norm_stats_entry`)."""
    return norm_stats_entry(norm_stats, unnorm_key)["action"]


def norm_stats_entry(norm_stats: Mapping[str, Any], unnorm_key: Optional[str] = None) -> Mapping[str, Any]:
    """Returns ``norm_stats[unnorm_key]``: one dataset's statistics (action, proprio, counts).

    With ``unnorm_key=None`` the single dataset is used when there is exactly one; otherwise, and
    for an unknown key, raises ``ValueError`` listing the available keys so the caller can fix it.
    """
    if not norm_stats:
        raise ValueError("norm_stats is empty: the model carries no dataset statistics to un-normalise with")
    available = ", ".join(repr(k) for k in sorted(norm_stats))
    if unnorm_key is None:
        if len(norm_stats) != 1:
            raise ValueError(f"the model was trained on {len(norm_stats)} datasets; pass unnorm_key, "
                             f"one of: {available}")
        unnorm_key = next(iter(norm_stats))
    if unnorm_key not in norm_stats:
        raise ValueError(f"unnorm_key {unnorm_key!r} is not in norm_stats; available keys: {available}")
    return norm_stats[unnorm_key]


def action_dim(norm_stats: Mapping[str, Any], unnorm_key: Optional[str] = None) -> int:
    """Number of action dimensions (tokens to generate) for a dataset: ``len(q01)``."""
    return len(get_action_stats(norm_stats, unnorm_key)["q01"])
