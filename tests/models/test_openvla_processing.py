"""OpenVLA preprocessing / prompt ids / action tokens against the golden reference fixtures."""

import json
import os

import numpy as np
import pytest
import torch
from conftest import OPENVLA_FIXTURES, reference_fixture
from PIL import Image

from models.openvla.action_tokenizer import ActionTokenizer, action_dim, get_action_stats
from models.openvla.processing_openvla import (
    OpenVLAImageProcessor,
    OpenVLAProcessor,
    build_prompt,
    left_pad_batch,
    prepare_prompt_ids,
)

FIXTURE_NAMES = OPENVLA_FIXTURES


def _load_json(folder, name):
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(params=FIXTURE_NAMES)
def fixture_dir(request):
    folder = reference_fixture(request.param)
    return folder


@pytest.fixture
def preprocessor_config(fixture_dir):
    return _load_json(fixture_dir, "preprocessor_config.json")


def test_pixel_values_match_reference(fixture_dir):
    processor = OpenVLAImageProcessor.from_pretrained(fixture_dir)
    images = np.load(os.path.join(fixture_dir, "raw_images.npz"))["images"]
    expected = np.load(os.path.join(fixture_dir, "pixel_values.npz"))["pixel_values"]
    pixel_values = processor(images)
    assert pixel_values.dtype == torch.float32
    assert tuple(pixel_values.shape) == expected.shape == (len(images), 6, 224, 224)
    assert np.abs(pixel_values.numpy() - expected).max() <= 1e-5
    # PIL inputs and one-at-a-time calls take the same path.
    single = processor(Image.fromarray(images[1]))
    assert torch.equal(single[0], pixel_values[1])


def test_normalisation_reads_tvf_params_not_means(fixture_dir, preprocessor_config):
    # Fixture b's tvf_normalize_params deliberately differ from means/stds; the former must win.
    processor = OpenVLAImageProcessor.from_dict(preprocessor_config)
    assert processor.normalize_params[0]["mean"] == preprocessor_config["tvf_normalize_params"][0]["mean"]


@pytest.mark.parametrize("strategy", ["resize-crop", "letterbox"])
def test_other_strategies_shapes(fixture_dir, preprocessor_config, strategy):
    processor = OpenVLAImageProcessor.from_dict(preprocessor_config, image_resize_strategy=strategy)
    images = np.load(os.path.join(fixture_dir, "raw_images.npz"))["images"]
    pixel_values = processor(images)
    assert tuple(pixel_values.shape) == (len(images), 6, 224, 224)
    assert torch.isfinite(pixel_values).all()
    # SigLIP channels are (x - 0.5) / 0.5 of values in [0, 1].
    assert pixel_values[:, 3:].min() >= -1.0 and pixel_values[:, 3:].max() <= 1.0


def test_resize_crop_keeps_aspect_and_crops_centre():
    processor = OpenVLAImageProcessor(image_resize_strategy="resize-crop")
    image = np.zeros((100, 200, 3), dtype=np.uint8)
    image[:, 50:150] = 255  # white centre half: exactly what a short-side resize + centre crop keeps
    siglip = processor(image)[0, 3:]
    assert torch.allclose(siglip[:, :, 5:-5], torch.ones_like(siglip[:, :, 5:-5]))


def test_letterbox_pads_with_fill_colour():
    processor = OpenVLAImageProcessor(image_resize_strategy="letterbox")
    assert processor.letterbox_fill == (127, 127, 127)  # int(255 * SigLIP mean 0.5)
    image = np.full((100, 200, 3), 255, dtype=np.uint8)  # wide white image: bands above and below
    pixel_values = processor(image)[0]
    siglip = pixel_values[3:]
    fill = (127 / 255 - 0.5) / 0.5
    assert torch.allclose(siglip[:, :50], torch.full_like(siglip[:, :50], fill), atol=1e-6)
    assert torch.allclose(siglip[:, -50:], torch.full_like(siglip[:, -50:], fill), atol=1e-6)
    assert torch.allclose(siglip[:, 62:162], torch.ones_like(siglip[:, 62:162]))


def _test_images(seed: int, shape) -> dict:
    """Camera-like test content: smooth gradients, hard edges and pure noise (PIL's worst case)."""
    rng = np.random.default_rng(seed)
    height, width = shape
    smooth = np.clip(np.cumsum(rng.integers(-3, 4, (2, height, width, 3)), axis=2) + 128, 0, 255)
    edges = np.zeros((2, height, width, 3))
    edges[:, :, width // 3:] = 255
    edges[:, height // 2:, :, 1] = 200
    noise = rng.integers(0, 256, (2, height, width, 3))
    return {name: x.astype(np.uint8) for name, x in (("smooth", smooth), ("edges", edges), ("noise", noise))}


@pytest.mark.parametrize("strategy", ["resize-naive", "resize-crop", "letterbox"])
@pytest.mark.parametrize("shape", [(480, 640), (256, 256), (100, 80)])
def test_torch_resize_is_within_two_levels_of_pil(fixture_dir, preprocessor_config, strategy, shape):
    """The documented tolerance of the GPU path (OpenVLAImageProcessor.resize_tensor): uint8
    values within 2 levels of PIL's, and under 1 % of them different at all."""
    processor = OpenVLAImageProcessor.from_dict(preprocessor_config, image_resize_strategy=strategy)
    for name, images in _test_images(sum(shape), shape).items():
        reference = processor.resize_pil(images).astype(np.int16)
        resized = processor.resize_tensor(torch.from_numpy(images))
        assert resized.dtype == torch.uint8 and tuple(resized.shape) == reference.shape == (2, 224, 224, 3)
        diff = np.abs(resized.numpy().astype(np.int16) - reference)
        assert diff.max() <= 2, (name, int(diff.max()))
        assert (diff > 0).mean() < 0.01, (name, float((diff > 0).mean()))


def test_split_path_equals_the_reference_pipeline(fixture_dir):
    processor = OpenVLAImageProcessor.from_pretrained(fixture_dir)
    images = np.load(os.path.join(fixture_dir, "raw_images.npz"))["images"]
    split = processor.normalize(torch.from_numpy(processor.resize_pil(images)))
    assert torch.equal(split, processor(images))
    # images already at the model's size pass the torch resize untouched
    small = torch.from_numpy(processor.resize_pil(images))
    assert torch.equal(processor.resize_tensor(small), small)


def test_non_uint8_images_rejected():
    with pytest.raises(TypeError):
        OpenVLAImageProcessor()(np.zeros((1, 8, 8, 3), dtype=np.float32))


def test_prepare_prompt_ids(fixture_dir):
    ids = _load_json(fixture_dir, "input_ids.json")
    for prompt, expected in zip(ids["prompt_input_ids"], ids["predict_action_input_ids"]):
        assert prepare_prompt_ids(prompt) == expected
    for sample in _load_json(fixture_dir, "expected_outputs.json")["predict_action"]:
        assert prepare_prompt_ids(sample["prompt_input_ids"]) == sample["generate_input_ids"]


def test_decode_matches_reference_actions(fixture_dir):
    config = _load_json(fixture_dir, "config.json")
    expected = _load_json(fixture_dir, "expected_outputs.json")
    tokenizer = ActionTokenizer.from_config(config)
    stats = get_action_stats(config["norm_stats"], expected["unnorm_key"])
    for sample in expected["predict_action"]:
        token_ids = np.array(sample["action_token_ids"])
        assert tokenizer.bin_index(token_ids).tolist() == sample["discretized_bin_index"]
        normalized = tokenizer.decode(token_ids)
        assert normalized.dtype == np.float64
        np.testing.assert_array_equal(normalized, sample["normalized_actions"])  # bit-exact
        actions = tokenizer.unnormalize(normalized, stats)
        assert actions.dtype == np.float64
        np.testing.assert_array_equal(actions, sample["actions"])
        np.testing.assert_array_equal(tokenizer.decode_actions(token_ids, stats), actions)
    assert action_dim(config["norm_stats"], expected["unnorm_key"]) == 7


def test_encode_matches_teacher_forced_tokens(fixture_dir):
    config = _load_json(fixture_dir, "config.json")
    teacher = _load_json(fixture_dir, "input_ids.json")["teacher_forced"]
    tokenizer = ActionTokenizer.from_config(config)
    encoded = tokenizer.encode(np.array(teacher["source_normalized_actions"]))
    assert encoded.tolist() == teacher["action_token_ids"]
    assert tokenizer.is_action_token(encoded).all()


def test_action_token_range_and_batch_shapes():
    tokenizer = ActionTokenizer(32064, pad_to_multiple_of=64)
    assert tokenizer.action_token_range() == (31744, 31999)
    actions = np.array([[-1.5, -1.0, 0.0, 1.0, 2.0]])
    tokens = tokenizer.encode(actions)
    assert tokens.shape == actions.shape
    assert tokens.tolist() == [[31999, 31999, 31872, 31744, 31744]]
    # Round trip lands within one bin width inside [-1, 1].
    values = np.linspace(-1, 1, 57)
    assert np.abs(tokenizer.decode(tokenizer.encode(values)) - values).max() <= 2 / 255 + 1e-12


def test_wrong_unnorm_key_lists_available_keys(fixture_dir):
    norm_stats = _load_json(fixture_dir, "config.json")["norm_stats"]
    with pytest.raises(ValueError) as excinfo:
        get_action_stats(norm_stats, "no_such_dataset")
    for key in norm_stats:
        assert key in str(excinfo.value)
    # A single dataset is used when no key is given.
    assert get_action_stats(norm_stats, None) is next(iter(norm_stats.values()))["action"]


def test_missing_unnorm_key_with_several_datasets():
    stats = {"q01": [0.0], "q99": [1.0]}
    norm_stats = {"bridge_orig": {"action": stats}, "fractal": {"action": stats}}
    with pytest.raises(ValueError, match="bridge_orig.*fractal"):
        get_action_stats(norm_stats, None)


def test_unnormalize_mask_passthrough():
    stats = {"q01": [-2.0, 0.0], "q99": [2.0, 10.0], "mask": [True, False]}
    out = ActionTokenizer.unnormalize(np.array([[0.5, 0.5], [-1.0, 1.0]]), stats)
    np.testing.assert_array_equal(out, [[1.0, 0.5], [-2.0, 1.0]])


def test_build_prompt():
    assert build_prompt("Pick up the Red block") == \
        "In: What action should the robot take to pick up the red block?\nOut:"
    assert build_prompt("Pick", lowercase=False) == "In: What action should the robot take to Pick?\nOut:"


def test_left_pad_batch():
    input_ids, mask = left_pad_batch([[1, 5, 6], [1, 7]], pad_token_id=32000)
    assert input_ids.tolist() == [[1, 5, 6], [32000, 1, 7]]
    assert mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    assert input_ids.dtype == torch.long


def test_processor_without_tokenizer(fixture_dir):
    processor = OpenVLAProcessor.from_pretrained(fixture_dir)
    assert processor.tokenizer is None and processor.pad_token_id == 32000
    ids = _load_json(fixture_dir, "input_ids.json")["prompt_input_ids"]
    images = np.load(os.path.join(fixture_dir, "raw_images.npz"))["images"]
    out = processor(images=images, input_ids=ids)
    assert out["pixel_values"].shape == (2, 6, 224, 224)
    assert out["attention_mask"].sum(dim=1).tolist() == [len(i) for i in ids]
    assert out["input_ids"][0, -len(ids[0]):].tolist() == ids[0]
    with pytest.raises(RuntimeError, match="tokenizer"):
        processor(text=build_prompt("pick up the cube"), images=images[:1])
