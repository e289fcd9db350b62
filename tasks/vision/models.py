"""Vision backbones as ``SplitModel``s: normalise -> extractor -> flat features | plug-ins | head.

Every builder puts a fixed per-dataset ``Normalize`` first inside ``features`` (images stay in [0, 1]
pixel space outside the model, so a trigger is pixel value 1.0), ends ``features`` with a flat
(B, feature_dim) vector, and makes ``head`` the single final ``nn.Linear`` — the layer FedUP's filter
and Lethe's adapter sit in front of.

- ``lenet5`` (feature_dim 84): conv5x5(6)-ReLU-maxpool2-conv5x5(16)-ReLU-maxpool2-fc120-ReLU-fc84-ReLU.
- ``resnet18`` / ``resnet34`` (512): CIFAR-style ResNet — 3x3 stride-1 stem, no max-pool, BasicBlocks
  [2,2,2,2] / [3,4,6,3], global average pool.
- ``vit`` (192): 4x4 patches (64 tokens + CLS), dim 192, depth 6, 3 heads, MLP 768, pre-norm,
  final LayerNorm, the CLS token is the feature vector.

Choices where the papers are silent: LeNet-5 uses ReLU and max-pooling (the modern variant);
ResNets reuse torchvision's BasicBlock and its initialisation (Kaiming-normal fan-out convs, BN weight
1 / bias 0); the ViT ("Transformer" in FedUP; Lethe uses HSViT on Tiny-ImageNet) is the small
32x32 configuration of the brief, no dropout, GELU MLP, learned position embeddings and CLS token
initialised N(0, 0.02) truncated at +-2 std, Linear and attention projections Xavier-uniform with zero
bias, drawn independently for every layer.

Normalisation statistics (per channel, over the training pool in [0, 1] pixel space):
digits (after 32x32 upsampling) 0.3053 / 0.3236; MNIST padded to 32x32 0.1001 / 0.2752 (from the
usual 28x28 values 0.1307 / 0.3081: mean' = m*784/1024, var' = (s^2+m^2)*784/1024 - mean'^2);
CIFAR-10 and CIFAR-100 their published per-pixel means and standard deviations. ``dataset=None``
maps [0, 1] to [-1, 1] (mean 0.5, std 0.5). The statistics are non-persistent buffers: constants,
not weights, so they stay out of ``state_dict`` and never cross the grid.

Initialisation draws from torch's global generator: call ``torch.manual_seed(seed)`` before building
to get identical weights.
"""

from __future__ import annotations

import torch
from torch import nn

from tasks.model import SplitModel

ARCHS = ("lenet5", "resnet18", "resnet34", "vit")

NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "digits": ((0.3053,), (0.3236,)),
    "mnist": ((0.1001,), (0.2752,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


class Normalize(nn.Module):
    """``(x - mean) / std`` per channel, with fixed statistics (one value broadcasts to all channels)."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def normalization_for(dataset: str | None, in_channels: int) -> Normalize:
    """The fixed input normalisation of ``dataset`` (or [0,1] -> [-1,1] when None) for ``in_channels``."""
    if dataset is None:
        return Normalize((0.5,) * in_channels, (0.5,) * in_channels)
    if dataset not in NORMALIZATION:
        raise ValueError(f"dataset must be one of {', '.join(NORMALIZATION)} or None, got {dataset!r}")
    mean, std = NORMALIZATION[dataset]
    if len(mean) != in_channels:
        raise ValueError(
            f"in_channels={in_channels} does not match dataset {dataset!r} ({len(mean)} channels)"
        )
    return Normalize(mean, std)


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def lenet5(num_classes: int, in_channels: int = 1, dataset: str | None = None) -> SplitModel:
    """LeNet-5 for 32x32 inputs; features end at the 84-unit layer, head = Linear(84, num_classes)."""
    _check_positive("num_classes", num_classes)
    _check_positive("in_channels", in_channels)
    features = nn.Sequential(
        normalization_for(dataset, in_channels),
        nn.Conv2d(in_channels, 6, kernel_size=5),  # 32 -> 28
        nn.ReLU(),
        nn.MaxPool2d(2),  # 28 -> 14
        nn.Conv2d(6, 16, kernel_size=5),  # 14 -> 10
        nn.ReLU(),
        nn.MaxPool2d(2),  # 10 -> 5
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
    )
    return SplitModel(features, nn.Linear(84, num_classes), feature_dim=84)


def _cifar_resnet(layers: list[int], num_classes: int, in_channels: int, dataset: str | None) -> SplitModel:
    from torchvision.models.resnet import BasicBlock, ResNet

    _check_positive("num_classes", num_classes)
    _check_positive("in_channels", in_channels)
    net = ResNet(BasicBlock, layers, num_classes=num_classes)
    # CIFAR stem: a 3x3 stride-1 convolution and no max-pool keep the 32x32 resolution for layer1.
    stem = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(stem.weight, mode="fan_out", nonlinearity="relu")
    features = nn.Sequential(
        normalization_for(dataset, in_channels),
        stem,
        net.bn1,
        net.relu,
        net.layer1,
        net.layer2,
        net.layer3,
        net.layer4,
        net.avgpool,
        nn.Flatten(),
    )
    return SplitModel(features, net.fc, feature_dim=512 * BasicBlock.expansion)


def resnet18(num_classes: int, in_channels: int = 3, dataset: str | None = None) -> SplitModel:
    """CIFAR-style ResNet-18 (3x3 stem, no max-pool); feature_dim 512, head = the final Linear."""
    return _cifar_resnet([2, 2, 2, 2], num_classes, in_channels, dataset)


def resnet34(num_classes: int, in_channels: int = 3, dataset: str | None = None) -> SplitModel:
    """CIFAR-style ResNet-34 (3x3 stem, no max-pool); feature_dim 512, head = the final Linear."""
    return _cifar_resnet([3, 4, 6, 3], num_classes, in_channels, dataset)


class ViTFeatures(nn.Module):
    """Patchify -> prepend CLS -> add position embeddings -> pre-norm Transformer -> LayerNorm -> CLS."""

    def __init__(self, normalize: Normalize, in_channels: int, image_size: int, patch_size: int,
                 dim: int, depth: int, heads: int, mlp_dim: int):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"patch_size={patch_size} must divide image_size={image_size}")
        self.normalize = normalize
        self.patch_embed = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        num_tokens = (image_size // patch_size) ** 2 + 1
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.empty(1, num_tokens, dim))
        layer = nn.TransformerEncoderLayer(
            d_model=dim, nhead=heads, dim_feedforward=mlp_dim, dropout=0.0,
            activation="gelu", batch_first=True, norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        # nn.TransformerEncoder deep-copies one layer: re-draw every layer so they do not start equal.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.MultiheadAttention):
                nn.init.xavier_uniform_(module.in_proj_weight)
                nn.init.zeros_(module.in_proj_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(self.normalize(x)).flatten(2).transpose(1, 2)  # (B, patches, dim)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos_embed
        return self.norm(self.encoder(tokens))[:, 0]


def vit_small(num_classes: int, in_channels: int = 3, dataset: str | None = None,
              image_size: int = 32) -> SplitModel:
    """Small ViT for 32x32 (patch 4, dim 192, depth 6, 3 heads, MLP 768); head = Linear on the CLS token."""
    _check_positive("num_classes", num_classes)
    _check_positive("in_channels", in_channels)
    dim = 192
    features = ViTFeatures(normalization_for(dataset, in_channels), in_channels, image_size,
                           patch_size=4, dim=dim, depth=6, heads=3, mlp_dim=4 * dim)
    head = nn.Linear(dim, num_classes)
    nn.init.xavier_uniform_(head.weight)
    nn.init.zeros_(head.bias)
    return SplitModel(features, head, feature_dim=dim)


_BUILDERS = {"lenet5": lenet5, "resnet18": resnet18, "resnet34": resnet34, "vit": vit_small}


def build_vision_model(arch: str, num_classes: int, in_channels: int,
                       dataset: str | None = None) -> SplitModel:
    """Build ``arch`` (one of ``ARCHS``) with ``dataset``'s input normalisation (None: 0.5 / 0.5)."""
    if arch not in _BUILDERS:
        raise ValueError(f"model arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    return _BUILDERS[arch](num_classes, in_channels=in_channels, dataset=dataset)
