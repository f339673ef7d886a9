"""Claim: tutorial-style, model-relative override globs replace exactly the nodes they name.

``layers.1[0-9].attention.rope`` must replace layers 10-19 of a 24-layer Qwen3 and
nothing else, although torchtitan's own node paths start with ``model_spec.model.``
(where the tutorial's glob silently matches nothing). Mistakes raise instead of
logging. The cpu grouped-experts implementation must agree with torchtitan's.
Config trees only, except two small numeric checks.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from torchtitan.models import qwen3
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.models.common.rope import CosSinRoPE
from torchtitan.trainer import Trainer

from recipes.kernels.grouped_experts import (
    TrnGroupedExperts,
    block_layout,
    blockwise_inputs,
    expert_loop,
    grouped_experts,
)
from recipes.kernels.rope import NKIRoPE
from recipes.overrides import (
    OverrideError,
    OverrideSpec,
    apply_override_specs,
    available_overrides,
    parse_override_spec,
)

N_LAYERS = 24


def trainer_config(flavor: str = "debugmodel", n_layers: int = N_LAYERS) -> Trainer.Config:
    """A Trainer.Config around Qwen3 ``flavor`` with ``n_layers`` layers (configs only).

    Like torchtitan's registry, every layer shares one RoPE config object, so the
    test also shows replacement is per node, not per object.
    """
    spec = qwen3.model_registry(flavor)
    first = spec.model.layers[0]
    spec.model.layers = [copy.deepcopy(first) for _ in range(n_layers)]
    for layer in spec.model.layers:
        layer.attention.rope = first.attention.rope
    return Trainer.Config(model_spec=spec)


def rope_types(config: Trainer.Config) -> list[type]:
    return [type(layer.attention.rope) for layer in config.model_spec.model.layers]


def _registry_keys() -> set[str]:
    return set(importlib.import_module("torchtitan.config.override")._REGISTRY)


# ---------------------------------------------------------------------------
# Parsing and the list of names
# ---------------------------------------------------------------------------


def test_available_overrides_lists_names_with_descriptions():
    overrides = available_overrides()
    assert {"rope_hf", "grouped_experts"} <= set(overrides)
    assert all(description for description in overrides.values())


@pytest.mark.parametrize(
    "text, expected",
    [
        ("rope_hf", OverrideSpec("rope_hf")),
        (
            " rope_hf = layers.1[0-9].attention.rope ",
            OverrideSpec("rope_hf", ("layers.1[0-9].attention.rope",)),
        ),
        (
            "rope_hf=layers.0.attention.rope,layers.2*.attention.rope",
            OverrideSpec("rope_hf", ("layers.0.attention.rope", "layers.2*.attention.rope")),
        ),
    ],
)
def test_parse_override_spec(text, expected):
    spec = parse_override_spec(text)
    assert spec == expected
    assert parse_override_spec(str(spec)) == spec


@pytest.mark.parametrize("text", ["rope_hf=", "rope_hf=layers.0.attention.rope,", "=layers.0"])
def test_parse_rejects_empty_parts(text):
    with pytest.raises(OverrideError, match="NAME=GLOB"):
        parse_override_spec(text)


def test_unknown_name_lists_available():
    with pytest.raises(
        OverrideError, match=r"unknown override 'flash_rope'; available: grouped_experts, rope_hf"
    ):
        apply_override_specs(trainer_config(), ["flash_rope=layers.0.attention.rope"])


# ---------------------------------------------------------------------------
# Scoping on a 24-layer Qwen3
# ---------------------------------------------------------------------------


def test_tutorial_glob_replaces_exactly_layers_10_to_19(record_property):
    config = trainer_config()
    log = apply_override_specs(config, ["rope_hf=layers.1[0-9].attention.rope"])
    replaced = [i for i, t in enumerate(rope_types(config)) if t is NKIRoPE.Config]
    untouched = [i for i, t in enumerate(rope_types(config)) if t is CosSinRoPE.Config]
    record_property("override_rope_hf_replaced_layers", replaced)
    assert replaced == list(range(10, 20))
    assert untouched == list(range(0, 10)) + list(range(20, N_LAYERS))
    assert len(log) == 10
    assert all("model_spec.model.layers.1" in line for line in log)


def test_unscoped_name_replaces_every_layer():
    config = trainer_config()
    apply_override_specs(config, ["rope_hf"])
    assert rope_types(config) == [NKIRoPE.Config] * N_LAYERS


def test_several_globs_and_full_prefix():
    config = trainer_config()
    apply_override_specs(
        config, ["rope_hf=layers.0.attention.rope,model_spec.model.layers.23.attention.rope"]
    )
    replaced = [i for i, t in enumerate(rope_types(config)) if t is NKIRoPE.Config]
    assert replaced == [0, 23]


def test_glob_matching_nothing_raises_with_what_exists():
    config = trainer_config()
    with pytest.raises(OverrideError) as err:
        apply_override_specs(config, ["rope_hf=layers.9[0-9].attention.rope"])
    assert str(err.value).startswith(
        "override 'rope_hf' glob 'layers.9[0-9].attention.rope' matched no node; "
        "the model has layers 0–23; nodes of this kind look like 'layers.0.attention.rope'"
    )
    assert rope_types(config) == [CosSinRoPE.Config] * N_LAYERS  # nothing half-applied


def test_overlapping_specs_raise_naming_both_and_the_node():
    config = trainer_config()
    with pytest.raises(OverrideError) as err:
        apply_override_specs(
            config, ["rope_hf=layers.1[0-9].attention.rope", "rope_hf=layers.15.attention.rope"]
        )
    message = str(err.value)
    assert "'rope_hf=layers.1[0-9].attention.rope'" in message
    assert "'rope_hf=layers.15.attention.rope'" in message
    assert "'layers.15.attention.rope'" in message
    assert rope_types(config) == [CosSinRoPE.Config] * N_LAYERS


def test_disjoint_specs_of_one_name_both_apply():
    config = trainer_config()
    apply_override_specs(
        config, ["rope_hf=layers.1.attention.rope", "rope_hf=layers.2.attention.rope"]
    )
    assert [i for i, t in enumerate(rope_types(config)) if t is NKIRoPE.Config] == [1, 2]


def test_override_on_a_model_without_such_nodes_raises():
    with pytest.raises(OverrideError, match="no GroupedExperts.Config nodes"):
        apply_override_specs(trainer_config(), ["grouped_experts"])


def test_no_registrations_leak_between_calls():
    before = _registry_keys()
    for _ in range(3):
        apply_override_specs(trainer_config(), ["rope_hf=layers.1[0-9].attention.rope"])
        with pytest.raises(OverrideError):
            apply_override_specs(trainer_config(), ["rope_hf=layers.99.attention.rope"])
    assert _registry_keys() == before
    assert trainer_config().override.imports == []


def test_grouped_experts_replaces_every_moe_layer():
    config = trainer_config("debugmodel_moe", n_layers=4)
    apply_override_specs(config, ["grouped_experts", "rope_hf=layers.0.attention.rope"])
    layers = config.model_spec.model.layers
    assert [type(layer.moe.routed_experts.inner_experts) for layer in layers] == [
        TrnGroupedExperts.Config
    ] * 4
    assert rope_types(config) == [NKIRoPE.Config] + [CosSinRoPE.Config] * 3
    stock = layers[0].moe.routed_experts.inner_experts
    assert (stock.dim, stock.hidden_dim, stock.num_experts) == (256, 768, 64)
    assert stock.param_init is not None  # derive() kept the init functions


# ---------------------------------------------------------------------------
# Numerics: the replaced modules against torchtitan's
# ---------------------------------------------------------------------------


def _build(config: Trainer.Config) -> torch.nn.Module:
    """Meta init, then to_empty + init_states: the trainer's path for buffers."""
    with torch.device("meta"):
        model = config.model_spec.model.build()
    model.to_empty(device="cpu")
    model.init_states(buffer_device=torch.device("cpu"))
    return model


@pytest.mark.slow
def test_rope_override_model_logits_and_grads_exact(monkeypatch, record_property):
    """A 2-layer Qwen3 with rope_hf on layer 1 equals the stock model exactly."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    configs = []
    for specs in ([], ["rope_hf=layers.1.attention.rope"]):
        config = trainer_config(n_layers=2)
        for layer in config.model_spec.model.layers:  # FlexAttention has no CPU backward
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
        apply_override_specs(config, specs)
        configs.append(config)
    stock, patched = (_build(c) for c in configs)
    patched.load_state_dict(stock.state_dict())
    assert type(patched.layers["1"].attention.rope).__name__ == "NKIRoPE"

    tokens = torch.randint(0, 2048, (2, 256), generator=torch.Generator().manual_seed(0))
    logits = [m(tokens) for m in (stock, patched)]
    for out in logits:
        out.float().logsumexp(-1).mean().backward()
    logit_diff = (logits[0] - logits[1]).abs().max().item()
    grad_diff = max(
        (a.grad - b.grad).abs().max().item()
        for a, b in zip(stock.parameters(), patched.parameters())
    )
    record_property("rope_override_logits_max_abs_diff", logit_diff)
    record_property("rope_override_grads_max_abs_diff", grad_diff)
    assert logit_diff == 0.0 and grad_diff == 0.0


#: Stock GroupedExperts rounds x, the weights and the SwiGLU product to bf16
#: (unit roundoff 2^-9 each) for torch._grouped_mm; the cpu loop stays in fp32.
#: Three roundings plus bf16 accumulation stay well inside 2^-6 of the largest
#: magnitude (observed: about 2^-7.5).
BF16_RELATIVE_TOLERANCE = 2**-6


def _experts_pair():
    g = torch.Generator().manual_seed(0)
    cfg = GroupedExperts.Config(dim=64, hidden_dim=96, num_experts=8)
    stock = cfg.build()
    with torch.no_grad():
        for p in stock.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)  # the models' init scale
    ours = grouped_experts(cfg).build()
    ours.load_state_dict(stock.state_dict())  # same parameter names and shapes
    counts = torch.tensor([5, 0, 17, 3, 40, 1, 0, 30])  # includes idle experts
    x = torch.randn(int(counts.sum()), 64, generator=g)
    return stock, ours, counts, x


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def test_cpu_grouped_experts_agree_with_stock(record_property):
    stock, ours, counts, x = _experts_pair()
    assert isinstance(ours, TrnGroupedExperts)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in stock.named_parameters()]
    grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for module in (stock, ours):
        x_in = x.clone().requires_grad_()
        out = module(x_in, counts)
        out.backward(grad_out)
        results.append((out, x_in.grad, [p.grad for p in module.parameters()]))
    (out_s, dx_s, dw_s), (out_o, dx_o, dw_o) = results

    diffs = {
        "out": _relative(out_o, out_s),
        "dx": _relative(dx_o, dx_s),
        **{
            f"d{name}": _relative(b, a)
            for (name, _), a, b in zip(stock.named_parameters(), dw_s, dw_o)
        },
    }
    for name, value in diffs.items():
        record_property(f"grouped_experts_{name}_max_rel_diff", value)
    assert max(diffs.values()) <= BF16_RELATIVE_TOLERANCE, diffs


def test_blockwise_layout_reproduces_the_loop():
    """The trn2 inputs (blocks, padding row, [E,H,2,I]/[E,I,H] weights), run through the
    moe_cte semantics nkilib documents, give the cpu loop's result (fp32 reassociation only)."""
    _, ours, counts, x = _experts_pair()
    w1, w2, w3 = ours.w1_EFD.detach(), ours.w2_EDF.detach(), ours.w3_EFD.detach()
    block = 16
    inputs = blockwise_inputs(x, counts, w1, w2, w3, dtype=torch.float32, block_size=block)
    rows, hidden = x.shape
    experts, _, _, inter = inputs.gate_up.shape
    ids = inputs.token_position_to_id.long().view(-1, block)
    assert ids.shape[0] == -(-rows // block) + experts  # static block count
    out = torch.zeros(rows + 1, hidden)
    for b in range(ids.shape[0]):
        e = int(inputs.block_to_expert[b])
        h = inputs.hidden[ids[b]]
        gate_up = (h @ inputs.gate_up[e].reshape(hidden, 2 * inter)).reshape(block, 2, inter)
        act = torch.nn.functional.silu(gate_up[:, 0]) * gate_up[:, 1]
        affinity = inputs.affinities.view(rows + 1, experts)[ids[b], e].unsqueeze(1)
        out.index_add_(0, ids[b], (act @ inputs.down[e]) * affinity)
    torch.testing.assert_close(out[:-1], expert_loop(x, counts, w1, w2, w3), rtol=1e-5, atol=1e-7)
    assert out[-1].abs().max() == 0  # padding ids only ever read the zero row


def test_block_layout_blocks_hold_one_expert_each():
    token_ids, block_to_expert = block_layout([3, 0, 5], num_rows=8, block_size=4)
    assert token_ids.tolist() == [0, 1, 2, 8, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]
    assert block_to_expert.flatten().tolist() == [0, 2, 2, 0, 0]


@pytest.mark.slow
def test_training_with_rope_hf_on_layers_10_to_19_is_bitwise_identical(record_property):
    """The tutorial's scoped override inside training: a 24-layer model, 3 AdamW steps, same losses."""
    from dataclasses import replace

    import torch

    from recipes.overrides import apply_override_specs
    from recipes.specs import sized_spec
    from recipes.tiers import TINY_DENSE

    def build(overrides):
        spec = sized_spec("4B", replace(TINY_DENSE, num_hidden_layers=24), name="tiny-24")
        replaced = apply_override_specs(spec, overrides)
        torch.manual_seed(0)
        return spec.model.build(), replaced

    stock, _ = build([])
    scoped, replaced = build(["rope_hf=layers.1[0-9].attention.rope"])
    assert len(replaced) == 10
    params = {k: v for k, v in stock.state_dict().items() if not k.endswith("rope.cache")}
    scoped.load_state_dict(params, strict=False)
    tokens = torch.randint(
        0, TINY_DENSE.vocab_size, (2, 257), generator=torch.Generator().manual_seed(1)
    )
    losses = {}
    for name, model in (("stock", stock), ("scoped", scoped)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[name] = []
        for _ in range(3):
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[name].append(loss.item())
    record_property("rope_scoped_training_losses", losses)
    assert losses["scoped"] == losses["stock"]
    assert losses["stock"][-1] < losses["stock"][0]


def test_rope_gathers_names_the_per_position_gather_of_each_rope_class():
    """Config 3's "RoPE without gather", judged on what the RoPE runs, whatever its class: stock CosSinRoPE
    gathers its cache rows (aten.index), the sliced RoPE and rope_hf (the suite's NKIRoPE) do not."""
    from recipes import nki_moe
    from recipes.kernels import ROPE_DESCRIPTIONS, rope_gathers, rope_in_use

    stock = trainer_config(n_layers=2)
    assert rope_gathers(stock) == {ROPE_DESCRIPTIONS["CosSinRoPE.Config"]: ["index"]}
    swapped = trainer_config(n_layers=2)
    apply_override_specs(swapped, ["rope_hf"])
    assert rope_gathers(swapped) == {next(iter(rope_in_use(swapped))): []}
    assert next(iter(rope_in_use(swapped))).startswith(ROPE_DESCRIPTIONS["NKIRoPE.Config"])
    sliced = rope_gathers(nki_moe.nki_moe_cpu())
    assert list(sliced.values()) == [[]] and next(iter(sliced)).startswith(
        ROPE_DESCRIPTIONS["SlicedCosSinRoPE.Config"]
    )
