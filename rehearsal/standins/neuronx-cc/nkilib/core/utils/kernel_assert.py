"""Stand-in of aws-neuron/nki-library src/nkilib_src/nkilib/core/utils/kernel_assert.py (tag 2.29 = main d2ad3a5).

``kernel_assert`` and ``assert_shape`` word a refusal as the real ones do (lines 16-26), so a rehearsal's
failure reads like the chip's. :func:`assert_packed` is the stand-in's own: the real kernels address HBM
through access patterns computed from a tensor's shape alone (``x.ap(pattern=..., offset=...)``, e.g.
core/embeddings/rope_hf.py lines 124-143 and 251-265), i.e. they read packed row-major memory and never
look at strides; a torch view that is not packed would be read as other elements, silently. The stand-in
refuses it instead, in the same words.
"""

from __future__ import annotations


def kernel_assert(condition: bool, error_text: str):
    # nki-library core/utils/kernel_assert.py:16-17
    assert condition, (
        f"[INTERNAL_ERROR] [NCC_INKI016] Kernel validation exception: {error_text} - Please check the "
        "validation message and adjust kernel inputs accordingly"
    )


def assert_shape(tensor, expected_shape, tensor_name, error_text=""):
    """Assert tensor shape matches expected shape (nki-library core/utils/kernel_assert.py:20-26)."""
    kernel_assert(
        tuple(tensor.shape) == tuple(expected_shape),
        f"Received unexpected shape for {tensor_name}. "
        f"Expected {tuple(expected_shape)}, received {tuple(tensor.shape)}. {error_text}",
    )


def assert_packed(kernel: str, **tensors) -> None:
    """Each named tensor (None skipped) is packed row-major, as the real kernel's access patterns read it."""
    for name, t in tensors.items():
        if t is None:
            continue
        kernel_assert(
            t.is_contiguous(),
            f"{name} of shape {tuple(t.shape)} has strides {tuple(t.stride())}: {kernel} reads it as packed "
            "row-major memory (access patterns from its shape; stand-in check, REHEARSAL: the real kernel would "
            "read other elements), hand it .contiguous()",
        )
