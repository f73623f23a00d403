"""The zoo's real-size transformers as factories for ``epilab tune --model`` (from tests/):

    cd tests && epilab tune --model zoo.factories:gpt2 --input 8x256x768:bfloat16 --train

The input shapes are the zoo's (``ZOO["real"][name].input_shape``).
"""

from __future__ import annotations

import torch.nn as nn

from zoo import ZOO


def gpt2() -> nn.Module:
    return ZOO["real"]["gpt2"].build()


def llama() -> nn.Module:
    return ZOO["real"]["llama"].build()


def bert() -> nn.Module:
    return ZOO["real"]["bert"].build()
