"""First divergence, by layer: the run's first batch through torchtitan's model and transformers' side by side.

When step 1 disagrees with the host reference (or a run asks with ``--localize``), the
same recorded tokens go through the run's own torchtitan model (its config from
``harness.config.build.build_config``, built on the host in fp32, the weights loaded through
the spec's own ``state_dict_adapter``) and through transformers' model of the weights,
and every mapped module's output is compared in forward order: the embedding; per
block the attention norm, q/k/v projections, q/k norms, RoPE'd q and k, the attention
output, the MLP norm, gate, up and MLP output, and the block; the final norm and the
head. The report names the first module beyond its tolerance and the next three.

transformers' side is recorded by transformers itself:
``transformers.model_debugging_utils.model_addition_debugger_context`` with
``use_repr=False`` (full tensors, one safetensors file per module input and output,
instead of its default repr slices) and ``do_prune_layers=False`` (every layer, not
only the first and last). Read in transformers 5.16's source: it records the outputs
of leaf modules only (a module with children gets ``outputs=None``), so the values it
does not hold are derived from ones it does: RoPE'd q/k with transformers' own
``apply_rotary_pos_emb`` from the q/k norms' outputs and the rotary module's (cos,
sin); a block's output as the next block's (or the final norm's) input. Dense Qwen3
only (MoE blocks are refused by name). torchtitan has no
such recorder, so its side is forward hooks on the mapped modules.

What it can name: a difference between the run's model as its config builds it (theta, tying,
norms, scales, the recipe's code and overrides, on the host with the kernels' torch twins) and
transformers' model of the same weights. It does not replay the device: a defect only the chip
computes (an NKI kernel, bf16 rounding on trn2) shows in the reference check, not here.

Memory: at Qwen3-4B one module's output for a 64-rank batch is ~1 GB; only a subset
is compared (``rows`` sequences of rank 0's first batch, their first ``tokens``
positions: with causal attention a prefix's outputs do not depend on what follows).
Measured (``python -m harness.reference.diagnosis cost --localize``, one thread, random weights at the
real 4B width, 1 and 2 layers, 256 tokens; two runs on a shared 2-core machine): 5.8-6.7 CPU-s
fixed + 0.9-1.5 CPU-s per layer (building torchtitan's model dominates), so ~40-60 CPU-s for
Qwen3-4B's 36 layers, plus reading the checkpoint (not measured); the debugger writes 325 MB +
108 MB per layer (~4.2 GB); the host holds both fp32 models (~2 × 16 GB at 4B).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers.model_debugging_utils import model_addition_debugger_context
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from harness.config.build import build_config
from harness.declare import catalogue

#: A module differs when max |Δ| > ULPS × eps(dtype) × max |transformers' output|, dtype the coarser
#: of the two outputs' (fp32 on the host: 7.6e-6 relative). Both sides compute the same math with
#: other kernels (fused vs separate QKV): on the cpu fixture every module of a clean pair agreed
#: exactly (max |Δ| 0, tests/cpu/test_localize.py records the control's largest fraction of its
#: tolerance), so 64 ulps is room for a kernel that sums in another order, not a measured spread;
#: the smallest defect the tests inject moves a module by 1e-3 relative (8,400 fp32 ulps).
ULPS = 64
#: Sequences and positions compared (module outputs at 4B: 2560-9728 wide, vocab 151,936).
ROWS, TOKENS = 1, 256
#: How many diverging modules after the first the report names.
NEXT = 3


@dataclass
class ModuleDiff:
    name: str
    layer: int | None
    torchtitan: str
    transformers: str
    dtype: str
    max_abs: float
    rel: float
    tolerance: float

    @property
    def differs(self) -> bool:
        return not self.max_abs <= self.tolerance  # NaN differs

    def line(self) -> str:
        where = self.name if self.layer is None else f"layer {self.layer} {self.name}"
        return (
            f"{where} (torchtitan {self.torchtitan} vs transformers {self.transformers}): max |Δ| "
            f"{self.max_abs:.3g}, relative {self.rel:.3g}, tolerance {self.tolerance:.3g} ({self.dtype})"
        )


@dataclass
class Localization:
    compared: list[ModuleDiff]
    rows: int
    tokens: int
    cost: dict = field(default_factory=dict)
    #: torchtitan parameters the checkpoint did not fill (left at torchtitan's init).
    not_loaded: list[str] = field(default_factory=list)

    @property
    def diverging(self) -> list[ModuleDiff]:
        return [d for d in self.compared if d.differs]

    @property
    def first(self) -> ModuleDiff | None:
        return self.diverging[0] if self.diverging else None

    def summary(self) -> str:
        scope = f"{len(self.compared)} modules over {self.rows} sequence(s) × {self.tokens} tokens"
        if self.not_loaded:
            scope += (
                f"; not in the checkpoint, left at torchtitan's init: {', '.join(self.not_loaded)}"
            )
        if self.first is None:
            return f"no module differs beyond its tolerance ({scope})"
        after = "; ".join(d.line() for d in self.diverging[1 : 1 + NEXT]) or "none"
        return f"first divergence: {self.first.line()}; next: {after} ({scope})"

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(
            first=asdict(self.first) if self.first else None,
            next=[asdict(d) for d in self.diverging[1 : 1 + NEXT]],
            summary=self.summary(),
        )
        return data


class LocalizeError(RuntimeError):
    pass


def module_pairs(titan, hf) -> list[tuple[str, int | None, object, object]]:
    """(name, layer, torchtitan output, transformers key) in forward order, for ``titan``'s modules.

    A torchtitan output is a module path or (path, tuple index); a transformers key is the
    debugger's file stem under the model's class name, or ("rope", i, 0|1) / ("block", i) for
    the derived values.
    """
    n = len(hf.model.layers)
    pairs = [("embedding", None, "tok_embeddings", "model.embed_tokens_outputs")]
    for i in range(n):
        t, h = f"layers.{i}", f"model.layers.{i}"
        block = titan.layers[str(i)] if str(i) in titan.layers else None
        pairs += [
            ("attention norm", i, f"{t}.attention_norm", f"{h}.input_layernorm_outputs"),
            ("q_proj", i, (f"{t}.attention.qkv_linear", 0), f"{h}.self_attn.q_proj_outputs"),
            ("k_proj", i, (f"{t}.attention.qkv_linear", 1), f"{h}.self_attn.k_proj_outputs"),
            ("v_proj", i, (f"{t}.attention.qkv_linear", 2), f"{h}.self_attn.v_proj_outputs"),
            ("q_norm", i, f"{t}.attention.q_norm", f"{h}.self_attn.q_norm_outputs"),
            ("k_norm", i, f"{t}.attention.k_norm", f"{h}.self_attn.k_norm_outputs"),
            ("RoPE'd q", i, (f"{t}.attention.rope", 0), ("rope", i, 0)),
            ("RoPE'd k", i, (f"{t}.attention.rope", 1), ("rope", i, 1)),
            ("attention", i, f"{t}.attention", f"{h}.self_attn.o_proj_outputs"),
            ("mlp norm", i, f"{t}.ffn_norm", f"{h}.post_attention_layernorm_outputs"),
        ]
        if getattr(block, "moe_enabled", False):
            raise LocalizeError(
                f"torchtitan's {t} is a MoE block: the localizer maps dense Qwen3 only"
            )
        pairs += [
            ("mlp gate", i, f"{t}.feed_forward.w1", f"{h}.mlp.gate_proj_outputs"),
            ("mlp up", i, f"{t}.feed_forward.w3", f"{h}.mlp.up_proj_outputs"),
            ("mlp", i, f"{t}.feed_forward", f"{h}.mlp.down_proj_outputs"),
            ("block", i, t, ("block", i)),
        ]
    return pairs + [
        ("final norm", None, "norm", "model.norm_outputs"),
        ("head", None, "lm_head", "lm_head_outputs"),
    ]


def _titan_outputs(titan, paths: set[str], ids, positions):
    """torchtitan's forward on ``ids`` with each module in ``paths`` recording its output (hooks)."""

    modules = dict(titan.named_modules())
    missing = sorted(p for p in paths if p not in modules)
    if missing:
        raise LocalizeError(
            f"torchtitan's model has no module {missing[0]!r} (the localizer maps native Qwen3 only)"
        )
    outputs, handles = {}, []
    for path in paths:

        def hook(_module, _args, out, path=path):
            outputs[path] = (
                tuple(o.detach().clone() for o in out)
                if isinstance(out, tuple)
                else out.detach().clone()
            )

        handles.append(modules[path].register_forward_hook(hook))
    try:
        with torch.no_grad():
            titan(ids, positions=positions) if positions is not None else titan(ids)
    finally:
        for h in handles:
            h.remove()
    return outputs


def _hf_outputs(hf, ids, positions, directory: Path):
    """transformers' forward under its own debugger, full tensors to ``directory``; a reader of them."""

    kwargs = {
        "use_cache": False,
        "attention_mask": torch.ones_like(ids),
    }  # causal over the window (batch_loss)
    if positions is not None:
        kwargs["position_ids"] = positions
    root = type(hf).__name__
    with model_addition_debugger_context(
        hf, debug_path=str(directory), do_prune_layers=False, use_repr=False
    ):
        hf(input_ids=ids, **kwargs)
    n = len(hf.model.layers)

    def read(stem: str):
        path = (
            directory / f"{root}.{stem}.safetensors"
            if not stem.startswith(root)
            else directory / f"{stem}.safetensors"
        )
        if not path.is_file():
            raise LocalizeError(
                f"transformers' debugger wrote no {path.name} (another transformers layout?)"
            )
        return load_file(path)["data"]

    def value(key):
        if isinstance(key, str):
            return read(key)
        kind, i = key[0], key[1]
        if kind == "rope":
            cos, sin = read("model.rotary_emb_outputs_0"), read("model.rotary_emb_outputs_1")
            q, k = (
                read(f"model.layers.{i}.self_attn.q_norm_outputs"),
                read(f"model.layers.{i}.self_attn.k_norm_outputs"),
            )
            return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)[
                key[2]
            ]  # [B, L, heads, D] like torchtitan's
        return (
            read(f"model.layers.{i + 1}_inputs_args_0")
            if i + 1 < n
            else read("model.norm_inputs_args_0")
        )

    return value


def compare(name: str, layer, titan_path: str, hf_name: str, a, b) -> ModuleDiff:
    """One module's outputs: max |Δ|, relative to max |transformers'|, against its dtype's tolerance."""

    coarser = max((a.dtype, b.dtype), key=lambda d: torch.finfo(d).eps)
    scale = b.detach().float().abs().max().item() if b.numel() else 0.0
    tolerance = ULPS * torch.finfo(coarser).eps * max(scale, torch.finfo(torch.float32).tiny)
    if a.numel() != b.numel():
        max_abs = float("inf")
    else:
        delta = (a.detach().float().reshape(-1) - b.detach().float().reshape(-1)).abs()
        max_abs = float("nan") if bool(delta.isnan().any()) else delta.max().item()
    rel = max_abs / scale if scale else max_abs
    return ModuleDiff(
        name,
        layer,
        titan_path,
        hf_name,
        str(coarser).removeprefix("torch."),
        max_abs,
        rel,
        tolerance,
    )


def localize(titan, hf, ids, positions=None, not_loaded: list[str] | None = None) -> Localization:
    """Both models on ``ids`` ([rows, tokens]); every mapped module compared in forward order.

    ``not_loaded``: torchtitan's parameters the checkpoint did not fill (``titan_model``), reported.
    """
    started, cpu = time.perf_counter(), time.process_time()
    titan.eval(), hf.eval()
    pairs = module_pairs(titan, hf)
    paths = {p if isinstance(p, str) else p[0] for _, _, p, _ in pairs}
    got = _titan_outputs(titan, paths, ids, positions)
    forwards = time.perf_counter()
    compared = []
    with tempfile.TemporaryDirectory(prefix="localize-") as directory:
        reference = _hf_outputs(hf, ids, positions, Path(directory))
        for name, layer, path, key in pairs:
            a = got[path] if isinstance(path, str) else got[path[0]][path[1]]
            label = path if isinstance(path, str) else f"{path[0]}[{path[1]}]"
            hf_label = (
                key
                if isinstance(key, str)
                else {
                    "rope": f"apply_rotary_pos_emb(q_norm, k_norm)[{key[-1]}]",
                    "block": "the next module's input",
                }[key[0]]
            )
            compared.append(compare(name, layer, label, hf_label, a, reference(key)))
        written = sum(p.stat().st_size for p in Path(directory).iterdir())
    cost = {
        "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu,
        "torchtitan_forward_s": forwards - started,
        "debugger_bytes": written,
    }
    return Localization(
        compared,
        rows=int(ids.shape[0]),
        tokens=int(ids.shape[1]),
        cost=cost,
        not_loaded=list(not_loaded or []),
    )


def titan_model(opts, state: dict | None = None):
    """(the run's torchtitan model on the host in fp32, loaded as torchtitan loads an HF checkpoint,
    the parameters the checkpoint did not fill: left at torchtitan's init, e.g. an untied head).

    ``state``: HF-named tensors; default the safetensors files of ``opts.model_dir`` (the
    checkpoint's own layout: transformers' in-memory MoE experts are fused, the files are not),
    through the spec's own ``state_dict_adapter.from_hf``.
    """

    from recipes.titan import set_default_dtype  # noqa: PLC0415 -- heavy: recipes.titan imports torchtitan (torchtitan+torch 2.9 s); this module stays light

    spec = build_config(opts).model_spec
    with torch.device("cpu"), set_default_dtype(torch.float32):
        model = spec.model.build()
    adapter = spec.state_dict_adapter(spec.model, str(opts.model_dir))
    if state is None:
        state = {}
        for path in sorted(Path(opts.model_dir).glob("*.safetensors")):
            state.update(load_file(path))
    state = adapter.from_hf(
        dict(state)
    )  # load_state_dict copies: the caller's tensors stay its own
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise LocalizeError(
            f"{opts.model_dir}: torchtitan's model has no parameter {unexpected[0]!r} "
            f"({len(unexpected)} such): the weights are not this recipe's model"
        )
    parameters = dict(model.named_parameters())
    return model.eval(), [k for k in missing if k in parameters]


def first_rows(record, rows: int = ROWS, tokens: int = TOKENS):
    """``rows`` sequences of the record's first batch (rank 0), their first ``tokens`` positions."""
    batch = record.batches[0]
    ids = batch["input"][:rows, :tokens]
    positions = batch.get("positions")
    return ids, (positions[:rows, :tokens] if positions is not None else None)


def localize_run(run, record, hf, rows: int = ROWS, tokens: int = TOKENS) -> Localization:
    """The run's first divergence (``run``: ``harness.reference.diagnosis.RunInfo`` with its options)."""

    if run.options is None:
        raise LocalizeError(
            "the run directory has no run.json: its torchtitan model cannot be rebuilt"
        )
    if run.recipe != catalogue.localized():
        raise LocalizeError(
            f"recipe {run.recipe!r}: only {catalogue.localized()}'s modules are mapped to transformers'"
        )
    if record.attention != "causal":
        raise LocalizeError(
            f"attention {record.attention!r}: the host model compares causal windows only"
        )
    opts = run.options.resolved() if run.options.model_dir is None else run.options
    ids, positions = first_rows(record, rows, tokens)
    model, not_loaded = titan_model(opts)
    return localize(model, hf, ids, positions, not_loaded)
