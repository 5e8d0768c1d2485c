"""A ResNet-18 written the way torchvision writes it: BasicBlock modules with a downsample
branch, a forward that is not a chain of children, and a ``num_classes`` keyword.

``width`` (64 in torchvision) scales every stage so tests stay small; ``in_channels`` is ours too,
and ``norm`` (torchvision takes a ``norm_layer``): "batch", or "group" for GroupNorm, whose output
does not depend on the other samples of the batch (data-parallel BatchNorm sees each rank's part).
"""

from __future__ import annotations

import torch
from torch import nn


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def norm_layer(norm: str, channels: int) -> nn.Module:
    return nn.BatchNorm2d(channels) if norm == "batch" else nn.GroupNorm(2, channels)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None, norm: str = "batch") -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = norm_layer(norm, planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = norm_layer(norm, planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers: list[int], num_classes: int = 1000, width: int = 64,
                 in_channels: int = 3, norm: str = "batch") -> None:
        super().__init__()
        self.norm = norm
        self.inplanes = width
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = norm_layer(norm, width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False),
                norm_layer(self.norm, planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample, self.norm)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes, norm=self.norm) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(*, num_classes: int = 1000, width: int = 64, in_channels: int = 3,
             norm: str = "batch") -> ResNet:
    return ResNet([2, 2, 2, 2], num_classes=num_classes, width=width, in_channels=in_channels,
                  norm=norm)
