"""Exports nothing, as the real ``nkilib/experimental/moe/bwd/__init__.py``: import ``blockwise_mm_backward``."""
