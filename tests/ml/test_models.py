"""The Appendix B architectures: shapes, sizes, dropout switch, batch norm."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dphype.ml.data import dataset_names, dataset_spec
from dphype.ml.models import MODELS, AdultMLP, CifarCNN, MnistCNN, build_model


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_adult_mlp_is_64_64_with_one_logit() -> None:
    model = build_model("adult-mlp", (108,), 2)
    assert isinstance(model, AdultMLP)
    assert model(torch.zeros(5, 108)).shape == (5, 1)
    assert _count(model) == (108 * 64 + 64) + (64 * 64 + 64) + (64 + 1)
    assert model.dropout.p == 0.2


def test_mnist_cnn_matches_appendix_b_layer_sizes() -> None:
    model = build_model("mnist-cnn", (1, 28, 28), 10)
    assert isinstance(model, MnistCNN)
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    # conv 32 + conv 64 (3x3), dense 9216 -> 128 -> 10
    assert _count(model) == 320 + 18496 + (9216 * 128 + 128) + (128 * 10 + 10)
    assert (model.dropout1.p, model.dropout2.p) == (0.25, 0.5)


def test_cifar_cnn_has_batch_norm_and_global_pooling() -> None:
    model = build_model("cifar-cnn", (3, 32, 32), 10)
    assert isinstance(model, CifarCNN)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert model(torch.zeros(2, 3, 8, 8)).shape == (2, 10)  # global average pooling: any size >= 4
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert [m.num_features for m in norms] == [32, 32, 64, 128]
    assert model.out.in_features == 128


@pytest.mark.parametrize("name, shape", [("adult-mlp", (7,)), ("mnist-cnn", (1, 28, 28)), ("cifar-cnn", (3, 8, 8))])
def test_dropout_switch(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    x = torch.randn(16, *shape)
    plain = build_model(name, shape, 10, dropout=False)
    plain.train()
    first = plain(x)
    assert torch.allclose(first, plain(x))  # no randomness without dropout
    noisy = build_model(name, shape, 10)
    noisy.train()
    assert not torch.allclose(noisy(x), noisy(x))


def test_every_registered_dataset_names_a_model() -> None:
    assert {dataset_spec(name).model for name in dataset_names()} <= set(MODELS)


def test_bad_names_and_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="model must be one of"):
        build_model("resnet", (3, 32, 32), 10)
    with pytest.raises(ValueError, match="input_shape"):
        build_model("adult-mlp", (1, 28, 28), 2)
    with pytest.raises(ValueError, match="num_classes"):
        build_model("adult-mlp", (4,), 1)


def test_adult_mlp_stacked_forward_matches_vmap_over_forward() -> None:
    """The stacked and the vmapped forward sum in different orders: compared in float64, where they agree to
    fan-in x 1.1e-16 x the layer's sum of |w x| (below 1e-12 here), to 1e-9; a wrong weight, bias or activation
    moves logits by 1e-2 or more."""
    from torch.func import functional_call, stack_module_state, vmap

    torch.manual_seed(0)
    copies = [build_model("adult-mlp", (7,), 2).double() for _ in range(3)]
    params, _ = stack_module_state(copies)
    x = torch.randn(5, 7, dtype=torch.float64)
    template = copies[0].eval()
    expected = vmap(lambda p, inp: functional_call(template, p, (inp,)), in_dims=(0, None))(params, x)
    with torch.no_grad():
        assert torch.allclose(template.stacked_forward(params, x), expected, rtol=0.0, atol=1e-9)
        template.train()  # dropout: independent masks per copy, scaled by 1 / (1 - p)
        same = {k: v[:1].expand_as(v) for k, v in params.items()}
        noisy = template.stacked_forward(same, x)
        assert not torch.allclose(noisy[0], noisy[1])
        assert torch.allclose(noisy.mean(dim=0), template.eval().stacked_forward(same, x)[0], atol=0.5)
