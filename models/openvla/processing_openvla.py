"""OpenVLA inputs: image preprocessing, prompt text and prompt ids, a thin processor.

The image pipeline reproduces the published PrismaticImageProcessor behaviour with plain PIL +
numpy + torch (no torchvision/timm): optional letterbox pad -> per backbone PIL resize -> center
crop -> /255 float32 -> per-channel normalise -> stack backbones along channels ([DINOv2, SigLIP]
-> 6 channels for the fused backbone). With PIL bicubic the output is bit-exact to the reference.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image

PROMPT_TEMPLATE = "In: What action should the robot take to {instruction}?\nOut:"
# Llama-2 emits 29871 (a bare SentencePiece space) after "Out:" during training; predict_action
# re-inserts it so generation starts where training did.
SPACE_TOKEN_ID = 29871
DEFAULT_PAD_TOKEN_ID = 32000
STRATEGIES = ("resize-naive", "resize-crop", "letterbox")
# PIL filter codes; torchvision's int interpolation codes are the same numbers.
_INTERPOLATIONS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC,
                   "lanczos": Image.LANCZOS, "box": Image.BOX, "hamming": Image.HAMMING}
# PIL filter -> torch interpolate mode, for the filters torch can antialias like PIL
_TORCH_MODES = {Image.BICUBIC: "bicubic", Image.BILINEAR: "bilinear"}
ImageInput = Union[np.ndarray, torch.Tensor, Image.Image, Sequence[Union[np.ndarray, Image.Image]]]


def build_prompt(instruction: str, lowercase: bool = True) -> str:
    """The OpenVLA prompt text for ``instruction`` (tokenise it with BOS).

    Lower-cased by default: OpenVLA's training data pipeline lower-cases every instruction and the
    reference's native ``predict_action`` and public evaluation wrappers do the same. The HF model
    card's example formats the instruction verbatim; pass ``lowercase=False`` for that.
    """
    instruction = instruction.strip()
    return PROMPT_TEMPLATE.format(instruction=instruction.lower() if lowercase else instruction)


def prepare_prompt_ids(token_ids: Sequence[int]) -> List[int]:
    """Prompt ids -> the ids ``predict_action`` hands to generation (appends 29871 if not last)."""
    ids = [int(t) for t in token_ids]
    if not ids:
        raise ValueError("empty prompt ids (expected at least BOS)")
    return ids if ids[-1] == SPACE_TOKEN_ID else ids + [SPACE_TOKEN_ID]


def left_pad_batch(batch: Sequence[Sequence[int]], pad_token_id: int = DEFAULT_PAD_TOKEN_ID
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Left-pads id lists to a ``[B, T]`` int64 batch plus its ``[B, T]`` attention mask.

    Left padding keeps every prompt's last token in the final column, which batched greedy
    generation needs. The pad id is ``config.pad_token_id`` (32000 for OpenVLA).
    """
    if not batch:
        raise ValueError("empty batch")
    length = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), length), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((len(batch), length), dtype=torch.long)
    for row, ids in enumerate(batch):
        if len(ids):
            input_ids[row, length - len(ids):] = torch.as_tensor(list(ids), dtype=torch.long)
            attention_mask[row, length - len(ids):] = 1
    return input_ids, attention_mask


def _as_pil_list(images: ImageInput) -> List[Image.Image]:
    """Accepts PIL images, uint8 [H, W, 3] / [N, H, W, 3] arrays or tensors, or lists of those."""
    if isinstance(images, Image.Image):
        return [images.convert("RGB")]
    if isinstance(images, torch.Tensor):
        images = images.detach().cpu().numpy()
    if isinstance(images, np.ndarray):
        if images.ndim == 3:
            images = images[None]
        if images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(f"expected uint8 images [N, H, W, 3], got shape {images.shape}")
        images = list(images)
    out = []
    for image in images:
        if isinstance(image, Image.Image):
            out.append(image.convert("RGB"))
            continue
        array = np.asarray(image)
        if array.dtype != np.uint8:  # silently rescaling floats would hide caller mistakes
            raise TypeError(f"expected uint8 images, got {array.dtype}")
        out.append(Image.fromarray(np.ascontiguousarray(array)).convert("RGB"))
    return out


def _filter(interpolation: Union[int, str]) -> int:
    """PIL filter code from an int code (torchvision/PIL share them) or a name like "bicubic"."""
    return _INTERPOLATIONS[interpolation.lower()] if isinstance(interpolation, str) else int(interpolation)


def _resized_size(width: int, height: int, size: Union[int, Sequence[int]]) -> Tuple[int, int]:
    """torchvision's resize size rule -> PIL (width, height): [h, w] exact, int = shorter side."""
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[1]), int(size[0])
    short_target = int(size[0] if isinstance(size, (list, tuple)) else size)
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(short_target * long / short)
    return (short_target, new_long) if width <= height else (new_long, short_target)


def _center_crop(image: Image.Image, out_h: int, out_w: int) -> Image.Image:
    """torchvision center_crop on PIL: zero-pad when too small, offsets rounded half to even."""
    width, height = image.size
    if out_w > width or out_h > height:
        left, top = max(out_w - width, 0) // 2, max(out_h - height, 0) // 2
        padded = Image.new(image.mode, (max(out_w, width), max(out_h, height)), (0, 0, 0))
        padded.paste(image, (left, top))
        image, (width, height) = padded, padded.size
    top, left = int(round((height - out_h) / 2.0)), int(round((width - out_w) / 2.0))
    if (top, left, out_w, out_h) == (0, 0, width, height):
        return image
    return image.crop((left, top, left + out_w, top + out_h))


def _resample(x: torch.Tensor, size: Tuple[int, int], mode: str) -> torch.Tensor:
    out = torch.nn.functional.interpolate(x, size=size, mode=mode, antialias=True, align_corners=False)
    return out.round().clamp(0, 255)


def _center_crop_tensor(x: torch.Tensor, out_h: int, out_w: int) -> torch.Tensor:
    """:func:`_center_crop` on a ``[N, C, H, W]`` tensor (same offsets, zero padding)."""
    height, width = x.shape[-2:]
    if out_w > width or out_h > height:
        top, left = max(out_h - height, 0) // 2, max(out_w - width, 0) // 2
        padded = x.new_zeros(*x.shape[:-2], max(out_h, height), max(out_w, width))
        padded[..., top:top + height, left:left + width] = x
        x, (height, width) = padded, padded.shape[-2:]
    top, left = int(round((height - out_h) / 2.0)), int(round((width - out_w) / 2.0))
    return x[..., top:top + out_h, left:left + out_w]


def _letterbox(image: Image.Image, fill: Tuple[int, int, int]) -> Image.Image:
    """Pads to (near-)square with ``fill``, same amount on both sides (reference rule: an odd
    difference loses one pixel, so the result can be one short of square; the resize fixes it)."""
    width, height = image.size
    side = max(width, height)
    pad_w, pad_h = int((side - width) / 2), int((side - height) / 2)
    canvas = Image.new("RGB", (width + 2 * pad_w, height + 2 * pad_h), tuple(int(c) for c in fill))
    canvas.paste(image, (pad_w, pad_h))
    return canvas


class OpenVLAImageProcessor:
    """Images -> float32 pixel values ``[N, C, H, W]`` (C = 3 per vision backbone, 6 when fused).

    Built from the ``preprocessor_config.json`` fields. Explicit ``tvf_*`` entries win over values
    derived from ``means``/``stds``/``input_sizes``, as in the reference ``from_dict`` path (the
    released checkpoint's DINOv2 normalisation constants differ from its ``means``/``stds``).
    """

    def __init__(self, image_resize_strategy: str = "resize-naive",
                 input_sizes: Sequence[Sequence[int]] = ((3, 224, 224), (3, 224, 224)),
                 interpolations: Sequence[str] = ("bicubic", "bicubic"),
                 means: Sequence[Sequence[float]] = ((0.485, 0.456, 0.406), (0.5, 0.5, 0.5)),
                 stds: Sequence[Sequence[float]] = ((0.229, 0.224, 0.225), (0.5, 0.5, 0.5)),
                 use_fused_vision_backbone: bool = True,
                 tvf_resize_params: Optional[Sequence[Mapping[str, Any]]] = None,
                 tvf_crop_params: Optional[Sequence[Mapping[str, Any]]] = None,
                 tvf_normalize_params: Optional[Sequence[Mapping[str, Any]]] = None,
                 tvf_do_letterbox: Optional[bool] = None,
                 tvf_letterbox_fill: Optional[Sequence[int]] = None,
                 **_unused: Any) -> None:
        if image_resize_strategy not in STRATEGIES:
            raise ValueError(f"image_resize_strategy {image_resize_strategy!r} not in {STRATEGIES}")
        self.image_resize_strategy = image_resize_strategy
        self.input_sizes = [list(s) for s in input_sizes]
        self.use_fused_vision_backbone = bool(use_fused_vision_backbone)
        n = len(self.input_sizes)
        resize, crop, normalize = [], [], []
        for idx in range(n):
            target = self.input_sizes[idx][-1]
            filter_code = _filter(interpolations[idx])
            # resize-crop: shorter side to the target, crop later; the other two: straight square.
            size = target if image_resize_strategy == "resize-crop" else [target, target]
            resize.append({"size": size, "interpolation": filter_code})
            crop.append({"output_size": list(self.input_sizes[idx][1:])})
            normalize.append({"mean": list(means[idx]), "std": list(stds[idx])})
        self.resize_params = [dict(p) for p in (tvf_resize_params or resize)]
        self.crop_params = [dict(p) for p in (tvf_crop_params or crop)]
        self.normalize_params = [dict(p) for p in (tvf_normalize_params or normalize)]
        self.do_letterbox = (image_resize_strategy == "letterbox") if tvf_do_letterbox is None \
            else bool(tvf_do_letterbox)
        # Reference quirk: the fill comes from the *last* backbone's means (0.5 -> 127 for SigLIP).
        fill = tvf_letterbox_fill if tvf_letterbox_fill is not None else [int(x * 255) for x in means[-1]]
        self.letterbox_fill = tuple(int(c) for c in fill)
        # float32 constants, matching torchvision's normalize on a float32 tensor.
        self._mean = [torch.tensor(p["mean"], dtype=torch.float32).view(-1, 1, 1) for p in self.normalize_params]
        self._std = [torch.tensor(p["std"], dtype=torch.float32).view(-1, 1, 1) for p in self.normalize_params]

    @classmethod
    def from_dict(cls, config: Mapping[str, Any], **overrides: Any) -> "OpenVLAImageProcessor":
        """Builds from a config dict; ``overrides`` replace fields.

        Overriding ``image_resize_strategy`` with a different value drops the stored, strategy
        specific ``tvf_resize_params``/``tvf_crop_params``/letterbox entries so they are re-derived.
        """
        merged = dict(config)
        new_strategy = overrides.get("image_resize_strategy")
        if new_strategy is not None and new_strategy != merged.get("image_resize_strategy"):
            for key in ("tvf_resize_params", "tvf_crop_params", "tvf_do_letterbox", "tvf_letterbox_fill"):
                merged.pop(key, None)
        merged.update(overrides)
        return cls(**merged)

    @classmethod
    def from_json_file(cls, path: str, **overrides: Any) -> "OpenVLAImageProcessor":
        """Builds from a ``preprocessor_config.json`` file."""
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f), **overrides)

    @classmethod
    def from_pretrained(cls, folder: str, **overrides: Any) -> "OpenVLAImageProcessor":
        """Builds from ``folder/preprocessor_config.json``."""
        return cls.from_json_file(os.path.join(folder, "preprocessor_config.json"), **overrides)

    def _transform(self, image: Image.Image) -> torch.Tensor:
        if self.do_letterbox:
            image = _letterbox(image, self.letterbox_fill)
        per_backbone = []
        for idx, (resize, crop) in enumerate(zip(self.resize_params, self.crop_params)):
            out_w, out_h = _resized_size(*image.size, resize["size"])
            resized = image if (out_w, out_h) == image.size else \
                image.resize((out_w, out_h), resample=_filter(resize.get("interpolation", "bicubic")))
            crop_h, crop_w = crop["output_size"]
            cropped = _center_crop(resized, int(crop_h), int(crop_w))
            x = torch.from_numpy(np.array(cropped, dtype=np.uint8)).permute(2, 0, 1).float().div(255)
            per_backbone.append((x - self._mean[idx]) / self._std[idx])
        return torch.cat(per_backbone, dim=0)

    def preprocess(self, images: ImageInput) -> torch.Tensor:
        """uint8 images ``[N, H, W, 3]`` / ``[H, W, 3]`` (numpy/tensor) or PIL image(s) ->
        float32 ``[N, C, H', W']``."""
        pil_images = _as_pil_list(images)
        if not pil_images:
            raise ValueError("no images given")
        return torch.stack([self._transform(img) for img in pil_images])

    __call__ = preprocess

    # -------------------------------------------------------------- split path: resize, normalise
    # The policy resizes once (rollout side), keeps the small uint8 images, and normalises where
    # the model runs. ``resize_tensor`` does the resize with torch on the images' own device (the
    # GPU, where the simulator rendered them); ``resize_pil`` is the reference. They differ only
    # by the rounding of PIL's fixed-point filter: at most 2 of 255 levels, on under 1 % of the
    # values (tests/models/test_openvla_processing.py holds both bounds). ``normalize`` after
    # ``resize_pil`` equals ``preprocess`` bit for bit.

    def _geometry(self) -> Tuple[Dict[str, Any], List[int]]:
        """The one resize + crop every backbone shares (OpenVLA's do: both 224, same filter)."""
        pairs = {json.dumps([self.resize_params[i], self.crop_params[i]], sort_keys=True)
                 for i in range(len(self.resize_params))}
        if len(pairs) != 1:
            raise ValueError("the backbones resize differently; split preprocessing needs one shared geometry")
        return self.resize_params[0], [int(v) for v in self.crop_params[0]["output_size"]]

    @property
    def torch_resizable(self) -> bool:
        """Whether ``resize_tensor`` supports this geometry's filter (bicubic, bilinear)."""
        resize, _ = self._geometry()
        return _filter(resize.get("interpolation", "bicubic")) in _TORCH_MODES

    def resize_pil(self, images: ImageInput) -> np.ndarray:
        """uint8 images -> uint8 ``[N, h, w, 3]`` at the model's resolution, with PIL."""
        resize, (crop_h, crop_w) = self._geometry()
        out = []
        for image in _as_pil_list(images):
            if self.do_letterbox:
                image = _letterbox(image, self.letterbox_fill)
            out_w, out_h = _resized_size(*image.size, resize["size"])
            if (out_w, out_h) != image.size:
                image = image.resize((out_w, out_h), resample=_filter(resize.get("interpolation", "bicubic")))
            out.append(np.array(_center_crop(image, crop_h, crop_w), dtype=np.uint8))
        return np.stack(out)

    def resize_tensor(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 ``[N, H, W, 3]`` tensor -> uint8 ``[N, h, w, 3]`` on the same device, with torch
        (antialiased like PIL)."""
        resize, (crop_h, crop_w) = self._geometry()
        mode = _TORCH_MODES[_filter(resize.get("interpolation", "bicubic"))]
        if images.ndim == 3:
            images = images[None]
        if images.dtype != torch.uint8 or images.shape[-1] != 3:
            raise TypeError(f"expected uint8 images [N, H, W, 3], got {images.dtype} {tuple(images.shape)}")
        x = images.permute(0, 3, 1, 2).float()
        if self.do_letterbox:
            height, width = x.shape[-2:]
            side = max(width, height)
            pad_w, pad_h = int((side - width) / 2), int((side - height) / 2)
            fill = torch.tensor(self.letterbox_fill, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
            canvas = fill.expand(x.shape[0], 3, height + 2 * pad_h, width + 2 * pad_w).clone()
            canvas[..., pad_h:pad_h + height, pad_w:pad_w + width] = x
            x = canvas
        height, width = x.shape[-2:]
        out_w, out_h = _resized_size(width, height, resize["size"])
        # PIL resamples in two passes, width then height, rounding to uint8 in between: doing
        # the same keeps the difference to PIL's fixed-point filter within 2 levels
        if out_w != width:
            x = _resample(x, (height, out_w), mode)
        if out_h != height:
            x = _resample(x, (out_h, out_w), mode)
        x = _center_crop_tensor(x, crop_h, crop_w)
        return x.to(torch.uint8).permute(0, 2, 3, 1)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 ``[N, h, w, 3]`` (already resized) -> float32 ``[N, C, h, w]`` on their device."""
        x = images.permute(0, 3, 1, 2).float().div(255)
        return torch.cat([(x - mean.to(x.device)) / std.to(x.device) for mean, std in zip(self._mean, self._std)],
                         dim=1)


class OpenVLAProcessor:
    """Image processor + optional HF tokenizer -> model inputs.

    Without a tokenizer (the golden fixtures ship none) images and ready-made ``input_ids`` still
    work; only tokenising text raises. Outputs match the reference processor: the 29871 rule is
    applied by generation (:func:`prepare_prompt_ids`), not here.
    """

    def __init__(self, image_processor: OpenVLAImageProcessor, tokenizer: Any = None,
                 pad_token_id: int = DEFAULT_PAD_TOKEN_ID) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.pad_token_id = int(pad_token_id)

    @classmethod
    def from_pretrained(cls, folder: str, load_tokenizer: bool = True, **kwargs: Any) -> "OpenVLAProcessor":
        """Loads ``preprocessor_config.json`` and, if the folder has one, its tokenizer (offline)."""
        tokenizer = None
        if load_tokenizer and _has_tokenizer_files(folder):
            from transformers import AutoTokenizer  # lazy: importing transformers takes seconds

            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        pad = kwargs.pop("pad_token_id", None)
        if pad is None:
            pad = _read_pad_token_id(folder)
        return cls(OpenVLAImageProcessor.from_pretrained(folder, **kwargs), tokenizer, pad)

    def tokenize(self, text: str) -> List[int]:
        """Prompt text -> ids with BOS; raises if no tokenizer is available."""
        if self.tokenizer is None:
            raise RuntimeError("OpenVLAProcessor has no tokenizer (none was found in the model folder); "
                               "pass input_ids directly or build the processor with a tokenizer")
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def __call__(self, text: Union[str, Sequence[str], None] = None, images: Optional[ImageInput] = None,
                 input_ids: Optional[Sequence[Any]] = None) -> Dict[str, torch.Tensor]:
        """Returns ``input_ids``/``attention_mask`` (left-padded when batched) and ``pixel_values``."""
        if text is not None and input_ids is not None:
            raise ValueError("pass either text or input_ids, not both")
        out: Dict[str, torch.Tensor] = {}
        if text is not None:
            input_ids = [self.tokenize(t) for t in ([text] if isinstance(text, str) else text)]
        elif input_ids is not None and len(input_ids) and not isinstance(input_ids[0], (list, tuple)):
            input_ids = [input_ids]  # a single flat id list
        if input_ids is not None:
            out["input_ids"], out["attention_mask"] = left_pad_batch(input_ids, self.pad_token_id)
        if images is not None:
            out["pixel_values"] = self.image_processor(images)
        return out


def _has_tokenizer_files(folder: str) -> bool:
    names = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    return any(os.path.isfile(os.path.join(folder, n)) for n in names)


def _read_pad_token_id(folder: str) -> int:
    """``config.json``'s pad_token_id when present, else OpenVLA's 32000."""
    path = os.path.join(folder, "config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            pad = json.load(f).get("pad_token_id")
        if pad is not None:
            return int(pad)
    return DEFAULT_PAD_TOKEN_ID
