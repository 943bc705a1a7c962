"""The paper's three model architectures (DP-Hype, Appendix B), as plain ``torch.nn.Module``s.

Every model maps a batch to logits of shape ``(B, K)``: ``K = 1`` for binary tasks (one logit for
binary cross-entropy with logits, as the paper's Adult MLP) and ``K = num_classes`` otherwise
(cross-entropy). The model of each data set is named by its entry in `dphype.ml.data.dataset_spec`.
``dropout=False`` builds the same architecture with all dropout rates set to 0
(used to compare batched and sequential training exactly).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn


def _outputs(num_classes: int) -> int:
    """One logit for two classes, one per class otherwise."""
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    return 1 if num_classes == 2 else num_classes


class AdultMLP(nn.Module):
    """Appendix B, Adult: two hidden layers of 64 ReLU units, dropout 0.2 after the second, raw logits.

    A ``num_classes`` below 2 raises ``ValueError``.

    Args:
        in_features: The number of input features ``D``.
        num_classes: The number of classes ``K >= 2`` (one logit for two).
        hidden: Units per hidden layer.
        dropout: Use dropout (``False``: rate 0).
    """

    def __init__(self, in_features: int, num_classes: int = 2, *, hidden: int = 64, dropout: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(0.2 if dropout else 0.0)
        self.out = nn.Linear(hidden, _outputs(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, K)`` logits of a ``(B, D)`` batch (``K = 1`` for two classes)."""
        h = torch.relu(self.fc1(x))
        h = self.dropout(torch.relu(self.fc2(h)))
        return self.out(h)

    def stacked_forward(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """`forward` of ``C`` stacked copies on one shared batch: ``(C, B, K)`` logits.

        Batched matrix products (the first layer one GEMM over all copies, since the input is shared) instead of
        ``torch.func.vmap``; in training mode dropout draws an independent mask per copy, like
        ``vmap(..., randomness="different")``.

        Args:
            params: This module's parameters (by name) with a leading axis of size ``C``.
            x: ``(B, D)`` features, shared by the copies.

        Returns:
            The logits.
        """
        copies = params["fc1.weight"].shape[0]
        w1 = params["fc1.weight"].flatten(0, 1)  # (C * hidden, D)
        h = torch.addmm(params["fc1.bias"].flatten(), x, w1.T).view(x.shape[0], copies, -1).transpose(0, 1)
        h = torch.baddbmm(params["fc2.bias"].unsqueeze(1), h.relu(), params["fc2.weight"].transpose(1, 2)).relu()
        if self.training and self.dropout.p > 0:
            keep = 1.0 - self.dropout.p
            h = h * ((torch.rand_like(h) < keep) / keep)
        return torch.baddbmm(params["out.bias"].unsqueeze(1), h, params["out.weight"].transpose(1, 2))


class MnistCNN(nn.Module):
    """Appendix B, MNIST: conv 3x3 (32) and conv 3x3 (64) with ReLU, 2x2 max-pool, then the dense layers.

    Then dropout 0.25 -> dense 128 + ReLU -> dropout 0.5 -> dense output (logits for cross-entropy).
    The appendix does not name the convolutions' activation; ReLU is assumed (unpadded convolutions,
    so 28x28 inputs give 64 x 12 x 12 features before the dense layers).

    A ``num_classes`` below 2 raises ``ValueError``.

    Args:
        in_channels: Image channels ``C``.
        image_size: Image height and width ``S`` (square images).
        num_classes: The number of classes ``K >= 2``.
        dropout: Use dropout (``False``: rate 0).
    """

    def __init__(
        self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10, *, dropout: bool = True
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25 if dropout else 0.0)
        self.fc1 = nn.Linear(64 * ((image_size - 4) // 2) ** 2, 128)
        self.dropout2 = nn.Dropout(0.5 if dropout else 0.0)
        self.fc2 = nn.Linear(128, _outputs(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, K)`` logits of ``(B, C, S, S)`` images (``K = 1`` for two classes)."""
        h = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        h = self.dropout1(torch.flatten(nn.functional.max_pool2d(h, 2), 1))
        h = self.dropout2(torch.relu(self.fc1(h)))
        return self.fc2(h)


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]


class CifarCNN(nn.Module):
    """Appendix B, CIFAR-10: two blocks of [conv 3x3 -> batch norm -> ReLU] x 2, 2x2 max-pool and dropout 0.25.

    Filters 32, 32 then 64, 128; then global average pooling and one dense output layer.
    Convolutions are padded ("same"), so any image size of at least 4x4 works.

    A ``num_classes`` below 2 raises ``ValueError``.

    Args:
        in_channels: Image channels ``C``.
        num_classes: The number of classes ``K >= 2``.
        dropout: Use dropout (``False``: rate 0).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, *, dropout: bool = True) -> None:
        super().__init__()
        rate = 0.25 if dropout else 0.0
        self.features = nn.Sequential(
            *_conv_bn_relu(in_channels, 32),
            *_conv_bn_relu(32, 32),
            nn.MaxPool2d(2),
            nn.Dropout(rate),
            *_conv_bn_relu(32, 64),
            *_conv_bn_relu(64, 128),
            nn.MaxPool2d(2),
            nn.Dropout(rate),
        )
        self.out = nn.Linear(128, _outputs(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, K)`` logits of ``(B, C, H, W)`` images, ``H, W >= 4`` (``K = 1`` for two classes)."""
        return self.out(self.features(x).mean(dim=(2, 3)))


_BUILDERS: dict[str, Callable[[Sequence[int], int, bool], nn.Module]] = {
    "adult-mlp": lambda shape, k, drop: AdultMLP(int(shape[0]), k, dropout=drop),
    "mnist-cnn": lambda shape, k, drop: MnistCNN(int(shape[0]), int(shape[1]), k, dropout=drop),
    "cifar-cnn": lambda shape, k, drop: CifarCNN(int(shape[0]), k, dropout=drop),
}

#: Names accepted by `build_model`.
MODELS: tuple[str, ...] = tuple(_BUILDERS)


def build_model(name: str, input_shape: Sequence[int], num_classes: int, *, dropout: bool = True) -> nn.Module:
    """A freshly initialised model ``name`` for inputs of shape ``input_shape``.

    Args:
        name: One of `MODELS`.
        input_shape: One sample's shape: ``(D,)`` for the MLP, ``(C, H, W)`` for the CNNs.
        num_classes: The number of classes ``K >= 2``.
        dropout: Use dropout (``False``: rate 0).

    Returns:
        The model.

    Raises:
        ValueError: ``name`` is unknown, or ``input_shape`` has the wrong number of dimensions.
    """
    if name not in _BUILDERS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}; got {name!r}")
    expected_dims = 1 if name == "adult-mlp" else 3
    if len(input_shape) != expected_dims:
        raise ValueError(f"input_shape for {name} must have {expected_dims} dimension(s), got {tuple(input_shape)}")
    return _BUILDERS[name](input_shape, num_classes, dropout)
