"""Each workaround fails with one line naming package, version and workaround when upstream moves.

Upstream is faked with monkeypatch (a changed signature, a removed attribute or module);
the real transformers / torchtitan / torch stay as installed. Also: the RoPE workaround
fits both shapes of ``compute_default_rope_parameters`` seen so far (transformers 5.16's
``(config, device=None)`` and 5.23's ``(config, **kwargs)``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from recipes.upstream_shape import MARKER, UpstreamShapeError, installed_version


def assert_one_line(
    err: pytest.ExceptionInfo, package: str, workaround: str, *mentions: str
) -> None:
    message = str(err.value)
    assert "\n" not in message, message
    assert message.startswith(
        f"{package} {installed_version(package)} {MARKER} {workaround}: it relies on "
    ), message
    for text in mentions:
        assert text in message, message


# --- recipes/hf_compat.py -------------------------------------------------------------------------


def tiny_qwen3_rotary():
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    config = Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    return Qwen3RotaryEmbedding, config


def test_rope_workaround_fits_both_known_signatures():
    """5.16: ``(config, device=None, **kwargs)``; 5.23: ``(config, **kwargs)`` (the filer's TypeError)."""
    from recipes.hf_compat import init_rotary_embeddings

    cls, config = tiny_qwen3_rotary()
    expected = cls(config).inv_freq.clone()

    def compute_default_rope_parameters(config, **kwargs):  # transformers 5.23's declaration
        base = config.rope_parameters["rope_theta"]
        dim = config.head_dim
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0

    as_in_523 = cls(config)
    as_in_523.compute_default_rope_parameters = compute_default_rope_parameters
    for module in (cls(config), as_in_523):
        with torch.no_grad():
            module.inv_freq.fill_(float("nan"))
            module.original_inv_freq.fill_(float("nan"))
            init_rotary_embeddings(module)
        torch.testing.assert_close(module.inv_freq, expected, rtol=0, atol=0)
        torch.testing.assert_close(module.original_inv_freq, expected, rtol=0, atol=0)


def test_rope_workaround_names_a_signature_it_cannot_call():
    from recipes.hf_compat import ROPE_WORKAROUND, init_rotary_embeddings

    cls, config = tiny_qwen3_rotary()
    module = cls(config)

    def compute_default_rope_parameters(
        config, device, seq_len
    ):  # a future upstream: seq_len required
        raise AssertionError("must not be called")

    module.compute_default_rope_parameters = compute_default_rope_parameters
    with pytest.raises(UpstreamShapeError) as err:
        init_rotary_embeddings(module)
    assert_one_line(
        err,
        "transformers",
        ROPE_WORKAROUND,
        "Qwen3RotaryEmbedding.compute_default_rope_parameters(config)",
        "(config, device, seq_len)",
    )


def test_rope_workaround_names_a_missing_attribute(monkeypatch):
    from recipes.hf_compat import ROPE_WORKAROUND, init_rotary_embeddings

    cls, config = tiny_qwen3_rotary()
    module = cls(config)
    del module.rope_type
    with pytest.raises(UpstreamShapeError) as err:
        init_rotary_embeddings(module)
    assert_one_line(
        err, "transformers", ROPE_WORKAROUND, "Qwen3RotaryEmbedding.rope_type", "missing: rope_type"
    )
    with pytest.raises(UpstreamShapeError) as err:
        init_rotary_embeddings(torch.nn.Linear(2, 2))
    assert_one_line(err, "transformers", ROPE_WORKAROUND, "a *RotaryEmbedding module in Linear")


def test_init_patch_workaround_names_a_removed_init_method(monkeypatch):
    from transformers.modeling_utils import PreTrainedModel

    from recipes.hf_compat import INIT_PATCH_WORKAROUND, pristine_init_methods

    assert set(pristine_init_methods()) == {"_init_weights", "_initialize_weights"}
    monkeypatch.delattr(PreTrainedModel, "_initialize_weights")
    with pytest.raises(UpstreamShapeError) as err:
        pristine_init_methods()
    assert_one_line(err, "transformers", INIT_PATCH_WORKAROUND, "missing: _initialize_weights")


def test_attention_workaround_names_a_moved_or_changed_sdpa_forward(monkeypatch):
    from recipes import hf_compat

    hf_compat.check_attention_shape()
    monkeypatch.setattr(hf_compat, "sdpa_attention_forward", lambda module, query, key, value: None)
    with pytest.raises(UpstreamShapeError) as err:
        hf_compat.check_attention_shape()
    assert_one_line(err, "transformers", hf_compat.ATTENTION_WORKAROUND, "attention_mask", "found")
    monkeypatch.setattr(hf_compat, "sdpa_attention_forward", None)  # the import failed
    with pytest.raises(UpstreamShapeError) as err:
        hf_compat.check_attention_shape()
    assert_one_line(err, "transformers", hf_compat.ATTENTION_WORKAROUND, "sdpa_attention_forward")


def test_adapter_workaround_names_a_changed_constructor(monkeypatch):
    from recipes import hf_compat
    from recipes.titan import HFTransformerStateDictAdapter

    monkeypatch.setattr(HFTransformerStateDictAdapter, "__init__", lambda self, model_config: None)
    with pytest.raises(UpstreamShapeError) as err:
        hf_compat.CompatStateDictAdapter(SimpleNamespace(), None)
    assert_one_line(
        err, "torchtitan", hf_compat.ADAPTER_WORKAROUND, "(model_config, hf_assets_path)"
    )


def test_moe_init_workaround_names_a_changed_init_states():
    from recipes import hf_compat

    model = SimpleNamespace(
        layers={"0": SimpleNamespace(moe=SimpleNamespace(init_states=lambda: None))}
    )
    with pytest.raises(UpstreamShapeError) as err:
        hf_compat.init_swapped_moe(model, None)
    assert_one_line(
        err, "torchtitan", hf_compat.MOE_INIT_WORKAROUND, "init_states(buffer_device=...)"
    )


# --- recipes/platform/cpu.py ----------------------------------------------------------------------


def test_device_patch_names_missing_torchtitan_names():
    from recipes.platform import cpu

    with pytest.raises(UpstreamShapeError) as err:
        cpu.check_device_utils(SimpleNamespace(device_type="cuda"))
    assert_one_line(
        err, "torchtitan", cpu.DEVICE_WORKAROUND, "missing: device_module, get_device_info"
    )


def test_device_patch_names_a_moved_module():
    from recipes.platform import cpu

    with pytest.raises(UpstreamShapeError) as err:
        cpu.import_device_copy("torchtitan.tools.no_such_module")
    assert_one_line(err, "torchtitan", cpu.DEVICE_WORKAROUND, "torchtitan.tools.no_such_module")


def test_fsdp_patch_names_a_removed_fsdp_method(monkeypatch):
    from torch.distributed.fsdp import FSDPModule

    from recipes.platform import cpu

    monkeypatch.delattr(FSDPModule, "set_force_sum_reduction_for_comms")
    with pytest.raises(UpstreamShapeError) as err:
        cpu._patch_fsdp_sum_reduction()
    assert_one_line(
        err, "torch", cpu.FSDP_WORKAROUND, "FSDPModule.set_force_sum_reduction_for_comms"
    )


def test_rope_parameters_from_another_config_is_what_that_config_builds():
    """recipes.hf_rope.rope_parameters(module, config): what a scorer asks for (e.g. another rope_theta)."""
    import copy

    from recipes.hf_rope import rope_parameters

    cls, config = tiny_qwen3_rotary()
    other = copy.deepcopy(config)
    other.rope_parameters = {**config.rope_parameters, "rope_theta": 5e6}
    inv_freq, scaling = rope_parameters(cls(config), other)
    torch.testing.assert_close(inv_freq, cls(other).inv_freq, rtol=0, atol=0)
    assert scaling == 1.0
