"""The ``neuron`` process-group backend (stand-in): gloo on the neuron tensors' CPU payloads.

The real one registers ``dist.Backend.register_backend("neuron", _create_neuron_process_group,
devices=["neuron"])`` (parmoham-aws/test-repo-parmoham torch_neuronx/distributed/backend.py) and,
when the first group is created, sets ``NEURON_RT_VISIBLE_CORES`` to the local rank if the user has
not (same file, ``_set_rt_visible_cores``: only when ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` are set).
That is a development copy, so the mapping is the switch ``QWEN3_STANDIN_LOCAL_RANK_CORES``.

Here the backend is gloo, registered for ``neuron`` and ``cpu``: a collective on neuron tensors
reaches :func:`torch_neuronx._cpu_device.run_on_cpu`, which calls the same c10d op on the payloads,
and the op then finds this group's cpu backend. gloo's limits are this backend's limits, except ``ReduceOp.PREMUL_SUM``,
which the public copy's backend takes (scaled inputs, then SUM) and this one takes the same way in
the two calls FSDP2 makes with it (:func:`_premul_as_sum`).
"""

from __future__ import annotations

import functools
import os

import torch.distributed as dist

LOCAL_RANK_SWITCH = "QWEN3_STANDIN_LOCAL_RANK_CORES"
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
_first_group = True


def set_rt_visible_cores() -> None:
    """``NEURON_RT_VISIBLE_CORES = LOCAL_RANK`` when unset (public copy's ``_set_rt_visible_cores``), if switched on."""
    if os.environ.get(LOCAL_RANK_SWITCH, "1") != "1":
        return
    local_rank, local_world = os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE")
    if local_rank is not None and local_world is not None and not os.environ.get(VISIBLE_CORES_ENV):
        os.environ[VISIBLE_CORES_ENV] = str(int(local_rank))


def _create_neuron_process_group(store, rank, size, timeout):
    """The public copy's creator name; returns gloo over the payloads (see the module docstring).

    The first group also fixes the device numbering as the public copy's does (its ``_set_local_world_size``,
    ``_set_local_device_start_index(local_rank)``): ``neuron:<LOCAL_RANK>`` is this process's device and
    ``device_count()`` is ``LOCAL_WORLD_SIZE``. Without those variables it finds them through the store
    (all ranks on one host here: the rank and the world size)."""
    global _first_group
    if _first_group:
        _first_group = False
        set_rt_visible_cores()
        from torch_neuronx import neuron  # noqa: PLC0415 -- circular: torch_neuronx.neuron imports the backend

        local_rank, local_world = os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE")
        if local_rank is not None and local_world is not None:
            neuron._set_distributed(int(local_rank), int(local_world))
        else:
            neuron._set_distributed(rank, size)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


# The public copy's class name, for code that checks isinstance against it.
ProcessGroupNeuron = dist.ProcessGroupGloo


def _premul_factor(op, group):
    """The factor of a ``ReduceOp.PREMUL_SUM`` on a ``neuron`` group, else None."""
    if not isinstance(op, dist.ReduceOp) or op != dist.ReduceOp.PREMUL_SUM:
        return None
    if dist.get_backend(group) != "neuron":
        return None
    return op.__getstate__()[1]


def _premul_as_sum() -> None:
    """``PREMUL_SUM(f)`` on a ``neuron`` group runs as ``SUM`` of ``f * input``, as the public copy's backend runs
    it (torch_neuronx/distributed/utils.py ``parse_and_update_inputs``, called by its allreduce and
    reduce-scatter). gloo, this stand-in's transport, rejects PREMUL_SUM, and the factor cannot be read once the
    op reaches the dispatcher, so the two calls FSDP2 makes with it (torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py: ``reduce_scatter_single``, ``all_reduce``) take the public copy's rule here."""
    c10d = dist.distributed_c10d
    reduce_scatter_single, all_reduce = c10d.reduce_scatter_single, c10d.all_reduce

    @functools.wraps(reduce_scatter_single)
    def reduce_scatter_single_premul(
        output, input, op=dist.ReduceOp.SUM, group=None, async_op=False
    ):
        factor = _premul_factor(op, group)
        if factor is not None:
            input, op = input * factor, dist.ReduceOp.SUM
        return reduce_scatter_single(output, input, op=op, group=group, async_op=async_op)

    @functools.wraps(all_reduce)
    def all_reduce_premul(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        factor = _premul_factor(op, group)
        if factor is not None:
            tensor.mul_(factor)
            op = dist.ReduceOp.SUM
        return all_reduce(tensor, op=op, group=group, async_op=async_op)

    for module in (c10d, dist):
        module.reduce_scatter_single, module.all_reduce = (
            reduce_scatter_single_premul,
            all_reduce_premul,
        )


def register_neuron_backend() -> None:
    if "neuron" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend("neuron", _create_neuron_process_group, devices=["neuron", "cpu"])
    _premul_as_sum()
