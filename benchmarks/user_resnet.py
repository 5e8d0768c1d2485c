"""A torchvision-style ResNet, written as a user would write their own model (not polytrain's zoo):
BasicBlocks in four stages, given to polytrain as ``--model benchmarks.user_resnet:resnet`` (the
bring-your-own-model path; `plan_testbed_validation.py` measures the planner on it)."""

from __future__ import annotations

from torch import Tensor, nn


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                            nn.BatchNorm2d(c_out))

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


class ResNet(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, width: int = 16, blocks: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        stages, c = [], width
        for i in range(4):
            c_out = width * 2**i
            stages.append(nn.Sequential(*(BasicBlock(c if j == 0 else c_out, c_out, 2 if i and j == 0 else 1)
                                          for j in range(blocks))))
            c = c_out
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet(in_channels: int, num_classes: int, width: int = 16, blocks: int = 1) -> nn.Module:
    """A ResNet-10-like network (``blocks`` BasicBlocks per stage) for (C, H, W) images."""
    return ResNet(in_channels, num_classes, width, blocks)
