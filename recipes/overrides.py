"""Named kernel overrides, scoped by model-relative fqn globs, on torchtitan's ``@override``.

Users name an override and, optionally, where it applies, as the tutorial writes it::

    --override rope_hf                                  # every CosSinRoPE
    --override rope_hf=layers.1[0-9].attention.rope     # layers 10-19 only
    --override grouped_experts --override rope_hf=layers.0.attention.rope

The globs are relative to the model. From the trainer, torchtitan's node paths are
``model_spec.model.layers.<i>.attention.rope``, so the tutorial's glob matches
nothing there and torchtitan only logs "produced no replacements". This module
prefixes the globs with the model's path, refuses a glob that matches no node,
two specs that claim the same node and unknown names, each with a message that
says what exists, and then lets torchtitan's ``apply_overrides`` do the
replacement.

Mechanism: for each spec, a one-off factory is registered with torchtitan's
``override(target=..., fqns=[full globs], exact=...)`` and named in an
``OverrideConfig``; the registrations are removed again when the call returns,
so nothing leaks between calls and other modules' registrations are untouched.
The replacements happen on the config tree, before anything is built, and are
not added to ``config.override.imports``, so the trainer does not apply them a
second time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatch

from recipes.errors import RecipeError
from recipes.titan import ModelSpec, OverrideConfig, apply_overrides, override

__all__ = [
    "MODEL_PREFIX",
    "NAMED_OVERRIDES",
    "NamedOverride",
    "OverrideError",
    "OverrideSpec",
    "apply_override_specs",
    "available_overrides",
    "parse_override_spec",
    "parse_override_specs",
    "replaced_nodes",
]

#: Where the model config sits in a ``Trainer.Config`` tree.
MODEL_PREFIX = "model_spec.model."


class OverrideError(RecipeError):
    """An override spec that names nothing, matches nothing or collides with another."""


@dataclass(frozen=True)
class NamedOverride:
    """A user-facing name for a torchtitan override factory and what it targets."""

    name: str
    factory: Callable
    targets: tuple[type, ...]
    exact: bool
    description: str
    #: The config type the factory puts in a replaced node's place (how a built config shows it ran).
    produces: type | None = None


def _named(
    name: str,
    factory: Callable,
    registration: dict,
    targets: tuple[type, ...] = (),
    produces: type | None = None,
) -> NamedOverride:
    # ``registration`` is the dict the kernel module passes to ``@override``,
    # so target/exact here cannot drift from torchtitan's registration.
    # ``targets`` adds config types the factory also accepts (each matched exactly).
    return NamedOverride(
        name=name,
        factory=factory,
        targets=tuple(dict.fromkeys((registration["target"], *targets))),
        exact=registration.get("exact", False),
        description=registration.get("description", ""),
        produces=produces,
    )


def _rope_hf() -> NamedOverride:
    from recipes.kernels import rope  # noqa: PLC0415 -- a kernel's module is imported when its override is used

    # rope_hf also replaces config 3's SlicedCosSinRoPE: without it, `--override rope_hf=GLOB`
    # on nki_moe found no (exact) CosSinRoPE node and was refused as matching nothing.
    return _named(
        "rope_hf",
        rope.rope_hf,
        rope.ROPE_HF_OVERRIDE,
        rope.ROPE_HF_TARGETS,
        produces=rope.NKIRoPE.Config,
    )


def _grouped_experts() -> NamedOverride:
    from recipes.kernels import grouped_experts  # noqa: PLC0415 -- a kernel's module is imported when its override is used

    return _named(
        "grouped_experts",
        grouped_experts.grouped_experts,
        grouped_experts.GROUPED_EXPERTS_OVERRIDE,
        produces=grouped_experts.TrnGroupedExperts.Config,
    )


class _KernelOverrides(Mapping):
    """Name -> :class:`NamedOverride`, importing a kernel's module when its override is first used.

    A run that uses one kernel (or none) never imports the other kernel's module.
    """

    def __init__(self, loaders: dict[str, Callable[[], NamedOverride]]) -> None:
        self._loaders = loaders
        self._loaded: dict[str, NamedOverride] = {}

    def __getitem__(self, name: str) -> NamedOverride:
        if name not in self._loaded:
            self._loaded[name] = self._loaders[name]()
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._loaders

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)

    def loaded(self) -> list[NamedOverride]:
        """The overrides used so far in this process (only their kernels can be in a config)."""
        return list(self._loaded.values())


NAMED_OVERRIDES: Mapping[str, NamedOverride] = _KernelOverrides(
    {"rope_hf": _rope_hf, "grouped_experts": _grouped_experts}
)


def available_overrides() -> dict[str, str]:
    """Override names and what they do, for ``python -m harness list``."""
    return {name: o.description for name, o in sorted(NAMED_OVERRIDES.items())}


@dataclass(frozen=True)
class OverrideSpec:
    """One ``--override`` value: a name and model-relative globs (None: every node)."""

    name: str
    globs: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return self.name if self.globs is None else f"{self.name}={','.join(self.globs)}"


def _unknown(name: str) -> OverrideError:
    return OverrideError(
        f"unknown override '{name}'; available: {', '.join(sorted(NAMED_OVERRIDES))}"
    )


def parse_override_spec(text: str) -> OverrideSpec:
    """Parse ``NAME`` or ``NAME=GLOB[,GLOB...]`` (globs relative to the model)."""
    name, sep, rest = text.strip().partition("=")
    name = name.strip()
    if not name:
        raise OverrideError(
            f"override spec {text!r} has no name; write NAME or NAME=GLOB[,GLOB...]"
        )
    if name not in NAMED_OVERRIDES:
        raise _unknown(name)
    if not sep:
        return OverrideSpec(name)
    globs = tuple(g.strip() for g in rest.split(","))
    if not all(globs):
        raise OverrideError(
            f"override spec {text!r} has an empty glob; write NAME=GLOB[,GLOB...], "
            f"e.g. {name}=layers.1[0-9].attention.rope, or just {name} for every node"
        )
    return OverrideSpec(name, globs)


def parse_override_specs(texts: Iterable[str | OverrideSpec]) -> list[OverrideSpec]:
    """Parse repeated ``--override`` values; parsed specs pass through."""
    return [t if isinstance(t, OverrideSpec) else parse_override_spec(t) for t in texts]


# ---------------------------------------------------------------------------
# Validation against the config tree
# ---------------------------------------------------------------------------


def _model_prefix(config) -> str:
    """The path of the model config inside ``config`` (a Trainer.Config, ModelSpec or model)."""
    if hasattr(config, "model_spec"):
        if config.model_spec is None:
            raise OverrideError("the config has no model_spec yet; set it before overriding")
        return MODEL_PREFIX
    if isinstance(config, ModelSpec):
        return "model."
    return ""


def _model(config):
    if hasattr(config, "model_spec"):
        return config.model_spec.model
    return config.model if isinstance(config, ModelSpec) else config


def _relative(glob: str, prefix: str) -> str:
    """Model-relative glob; a glob already written with the full prefix is accepted too."""
    return glob[len(prefix) :] if prefix and glob.startswith(prefix) else glob


def _nodes(config, named: NamedOverride, prefix: str) -> list[str]:
    """Model-relative fqns of the nodes ``named`` can replace, as torchtitan traverses them."""
    return [
        fqn[len(prefix) :]
        for target in named.targets
        for fqn, cfg, _, _ in config.traverse(target)
        if fqn.startswith(prefix) and (not named.exact or type(cfg) is target)
    ]


def _no_match(spec: OverrideSpec, glob: str | None, nodes: list[str], config) -> OverrideError:
    named = NAMED_OVERRIDES[spec.name]
    n_layers = len(getattr(_model(config), "layers", None) or [])
    layers = f"the model has layers 0–{n_layers - 1}" if n_layers else "the model has no layers"
    if not nodes:
        kind = " or ".join(t.__qualname__ for t in named.targets)
        return OverrideError(
            f"override '{spec.name}' matched no node; {layers} but no {kind} nodes "
            "(already replaced, or a model without them)"
        )
    return OverrideError(
        f"override '{spec.name}' glob '{glob}' matched no node; {layers}; "
        f"nodes of this kind look like '{nodes[0]}' (globs are relative to the model)"
    )


def _check_claims(config, specs: list[OverrideSpec], prefix: str) -> None:
    """Every glob matches a node, and no node is claimed by two specs."""
    owner: dict[str, OverrideSpec] = {}
    for spec in specs:
        nodes = _nodes(config, NAMED_OVERRIDES[spec.name], prefix)
        if spec.globs is None:
            claimed = nodes
            if not claimed:
                raise _no_match(spec, None, nodes, config)
        else:
            claimed = []
            for glob in spec.globs:
                matched = [n for n in nodes if fnmatch(n, _relative(glob, prefix))]
                if not matched:
                    raise _no_match(spec, glob, nodes, config)
                claimed += matched
        for node in dict.fromkeys(claimed):
            if node in owner:
                raise OverrideError(
                    f"overrides '{owner[node]}' and '{spec}' both claim node '{node}'; "
                    "narrow their globs so each node has one override"
                )
            owner[node] = spec


# ---------------------------------------------------------------------------
# Application through torchtitan
# ---------------------------------------------------------------------------


def _unregister(key: str) -> None:
    # torchtitan only offers clear_overrides(), which would also drop every
    # other module's registrations; remove just the one this module added.
    from recipes.titan import _OVERRIDE_REGISTRY  # noqa: PLC0415 -- lazy: recipes.titan resolves torchtitan names on first use, after recipes.platform.install

    _OVERRIDE_REGISTRY.pop(key, None)


def _scoped_factory(named: NamedOverride, key: str) -> Callable:
    def factory(cfg):
        return named.factory(cfg)

    # The key torchtitan registers and logs under: "recipes.overrides.rope_hf#0_1".
    factory.__name__ = factory.__qualname__ = f"{named.name}#{key}"
    factory.__module__ = __name__
    return factory


@contextlib.contextmanager
def _registered(specs: list[OverrideSpec], prefix: str) -> Iterator[list[str]]:
    """Register one scoped torchtitan override per spec and target type; yield their import keys."""
    keys: list[str] = []
    try:
        for index, spec in enumerate(specs):
            named = NAMED_OVERRIDES[spec.name]
            fqns = (
                None if spec.globs is None else [prefix + _relative(g, prefix) for g in spec.globs]
            )
            for t_index, target in enumerate(named.targets):
                factory = _scoped_factory(named, f"{index}_{t_index}")
                override(
                    target=target,
                    fqns=fqns,
                    exact=named.exact,
                    description=f"{spec}: {named.description}",
                )(factory)
                keys.append(f"{factory.__module__}.{factory.__name__}")
        yield keys
    finally:
        for key in keys:
            _unregister(key)


def apply_override_specs(config, specs: Iterable[str | OverrideSpec]) -> list[str]:
    """Apply ``--override`` specs to ``config`` (a Trainer.Config, before build) in place.

    Returns torchtitan's replacement log lines. Raises :class:`OverrideError` for
    an unknown name, a glob that matches no node, or two specs claiming one node.
    """
    parsed = parse_override_specs(specs)
    if not parsed:
        return []
    prefix = _model_prefix(config)
    _check_claims(config, parsed, prefix)
    with _registered(parsed, prefix) as imports:
        try:
            return apply_overrides(OverrideConfig(imports=imports), config)
        except ValueError as e:  # e.g. torchtitan's nested-node conflict check
            raise OverrideError(str(e)) from e


def replaced_nodes(config) -> dict[str, list[str]]:
    """``{override name: [model-relative fqn of every node it replaced]}`` in a finished config.

    Read from the config itself (nodes of the type each override produces), not from
    what was asked: provenance records what a run really built, so "applied" and
    "silently not applied" differ in the report even when the losses are identical.
    """
    prefix = _model_prefix(config)
    found: dict[str, list[str]] = {}
    for named in NAMED_OVERRIDES.loaded():
        if named.produces is None:
            continue
        nodes = [_relative(fqn, prefix) for fqn, _, _, _ in config.traverse(named.produces)]
        if nodes:
            found[named.name] = nodes
    return found
