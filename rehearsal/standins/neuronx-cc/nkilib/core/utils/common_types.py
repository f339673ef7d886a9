"""Stand-in of aws-neuron/nki-library src/nkilib_src/nkilib/core/utils/common_types.py (the enums the MoE kernels take)."""

from enum import Enum


class ActFnType(Enum):
    SiLU = 0
    GELU = 1
    GELU_Tanh_Approx = 2
    Swish = 3
    ReLU = 4


class ExpertAffinityScaleMode(Enum):
    NO_SCALE = 0
    POST_SCALE = 1
    PRE_SCALE = 2
    PRE_SCALE_DELAYED = 3
