"""torchvision's ResNet-18 as one ``nn.Module`` class: the file ``--model-file`` points at.

The server instantiates the single ``nn.Module`` subclass defined here with no arguments and loads
the archive's state dict into it (TorchServe's eager-mode layout).
"""

from __future__ import annotations

from torchvision.models.resnet import BasicBlock, ResNet


class ImageClassifier(ResNet):
    """ResNet-18: four stages of two basic blocks, 1000 ImageNet classes."""

    def __init__(self) -> None:
        super().__init__(BasicBlock, [2, 2, 2, 2])
