"""ResNet-18/50 training steps fed by a PyTorch DataLoader with one worker per core (needs PyTorch).

The JPEG set and the augmentation are the image pipeline's (`images.load_sample`); the model is the
standard ResNet (basic blocks [2,2,2,2] for 18, bottlenecks [3,4,6,3] for 50), trained with SGD and
cross-entropy. On a GPU: channels-last and bf16 autocast by default; each step ends with a synchronise so
a report means the step is done. On a CPU it runs too (that is how the tests exercise it without a GPU).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from hetplan.profiling.protocol import allocation
from hetplan.profiling.workloads.images import ensure_jpegs, load_sample

ARCHS = {"resnet18": ("basic", (2, 2, 2, 2)), "resnet50": ("bottleneck", (3, 4, 6, 3))}


class _Basic(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.down = _downsample(inplanes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.down(x) if self.down is not None else x))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.down = _downsample(inplanes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (self.down(x) if self.down is not None else x))


def _downsample(inplanes: int, outplanes: int, stride: int) -> nn.Module | None:
    if stride == 1 and inplanes == outplanes:
        return None
    return nn.Sequential(nn.Conv2d(inplanes, outplanes, 1, stride, bias=False), nn.BatchNorm2d(outplanes))


class ResNet(nn.Module):
    """ResNet-18 or -50 for `classes` classes."""

    def __init__(self, arch: str = "resnet18", classes: int = 1000) -> None:
        super().__init__()
        kind, layers = ARCHS[arch]
        block: Any = _Basic if kind == "basic" else _Bottleneck
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        )
        stages: list[nn.Module] = []
        inplanes = 64
        for i, count in enumerate(layers):
            planes = 64 * 2**i
            for j in range(count):
                stages.append(block(inplanes, planes, 2 if (j == 0 and i > 0) else 1))
                inplanes = planes * block.expansion
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class JpegDataset(Dataset):
    """The JPEG set, augmented per sample; `length` repeats it so an epoch is never a handful of steps."""

    def __init__(self, paths: list[str], crop: int, classes: int, length: int, seed: int = 0) -> None:
        self.paths, self.crop, self.classes, self.length, self.seed = paths, crop, classes, length, seed
        self._rng: np.random.Generator | None = None
        self._pid = -1

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._pid != os.getpid():  # one generator per DataLoader worker process
            self._rng, self._pid = np.random.default_rng([self.seed, os.getpid()]), os.getpid()
        assert self._rng is not None
        item = index % len(self.paths)
        pixels = load_sample(self.paths[item], self.crop, self._rng)
        return torch.from_numpy(np.ascontiguousarray(pixels)), item % self.classes


def run(report: Callable[[int], None], *, data_dir: str, arch: str = "resnet50", images: int = 256,
        width: int = 500, height: int = 375, quality: int = 90, seed: int = 0, batch_size: int = 64,
        crop: int = 224, classes: int = 1000, workers: int | None = None, device: str | None = None,
        amp: bool | None = None, steps: int | None = None) -> None:
    """Train until stopped (or for `steps` steps), reporting each step's samples."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    torch.manual_seed(seed)
    alloc = allocation()
    workers = alloc.workers if workers is None else workers
    torch.set_num_threads(max(1, alloc.cpus))
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = target.type == "cuda"
    use_amp = cuda if amp is None else amp
    paths = [str(p) for p in ensure_jpegs(data_dir, images, width, height, quality, seed)]
    dataset = JpegDataset(paths, crop, classes, length=max(len(paths), batch_size * 64), seed=seed)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
                        pin_memory=cuda, persistent_workers=workers > 0)
    memory_format = torch.channels_last if cuda else torch.contiguous_format
    model = ResNet(arch, classes).to(target, memory_format=memory_format)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    autocast = torch.autocast(target.type, dtype=torch.bfloat16) if use_amp else nullcontext()
    model.train()
    done = 0
    while steps is None or done < steps:
        for inputs, labels in loader:
            inputs = inputs.to(target, non_blocking=True).contiguous(memory_format=memory_format)
            labels = labels.to(target, non_blocking=True)
            with autocast:
                loss = F.cross_entropy(model(inputs), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if cuda:
                torch.cuda.synchronize(target)
            report(len(inputs))
            done += 1
            if steps is not None and done >= steps:
                break
