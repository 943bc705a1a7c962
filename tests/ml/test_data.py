"""Loaders (bundled Adult / mnist5k, IDX and CIFAR pickles in tmp folders) and partitioners."""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from dphype.ml import data
from dphype.ml.data import (
    Dataset,
    load_adult,
    load_dataset,
    partition_dirichlet,
    partition_iid,
    read_idx,
    split_indices,
)

# ------------------------------------------------------------------------------------------------
# bundled files


@pytest.mark.parametrize(
    "name, digest",
    [
        ("adult.data.gz", "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d"),
        ("adult.test.gz", "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05"),
        ("adult.names", "c248284c0b5de30c9e1958d6cdd168a34a654758b620e68f46aefa83fc0a576a"),
        ("mnist_5k.csv.gz", "167bbe5fc3dfbce27f9a4c6c1814964f3367677ee226d9811d79cbd41fd5d053"),
    ],
)
def test_bundled_files_match_provenance_checksums(name: str, digest: str) -> None:
    content = data._bundled(name)
    assert hashlib.sha256(content).hexdigest() == digest
    provenance = importlib.resources.files("dphype").joinpath("data", "PROVENANCE.md").read_text()
    assert digest in provenance


@pytest.fixture(scope="module")
def adult() -> tuple[Dataset, Dataset]:
    return load_adult()


def test_adult_uses_all_rows_with_a_20_percent_test_split(adult: tuple[Dataset, Dataset]) -> None:
    pool, test = adult
    assert len(pool) + len(test) == 48842
    assert len(test) == round(0.2 * 48842)
    assert pool.x.shape[1] == test.x.shape[1]
    assert pool.num_classes == 2 and pool.name == "adult"
    # about 24 % of Adult earns > 50K (adult.names: 23.93 %)
    assert 0.22 < pool.y.mean() < 0.26 and 0.22 < test.y.mean() < 0.26


def test_adult_features_are_standardized_numeric_plus_one_hot(adult: tuple[Dataset, Dataset]) -> None:
    pool, _ = adult
    binary = np.all(np.isin(pool.x, (0.0, 1.0)), axis=0)
    numeric = ~binary
    assert numeric.sum() == 6  # age, fnlwgt, education-num, capital-gain, capital-loss, hours-per-week
    np.testing.assert_allclose(pool.x[:, numeric].mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(pool.x[:, numeric].std(axis=0), 1.0, atol=1e-4)
    # each of the 8 categorical attributes contributes exactly one 1 per row ("?" is a category)
    np.testing.assert_array_equal(pool.x[:, binary].sum(axis=1), 8.0)


def test_adult_parser_handles_test_file_quirks() -> None:
    text = (
        "|1x3 Cross validator\n"
        "25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Black, Male, 0, 0, 40, "
        "United-States, <=50K.\n"
        "52, ?, 287927, HS-grad, 9, Married-civ-spouse, ?, Wife, White, Female, 15024, 0, 40, ?, >50K.\n"
        "\n"
    )
    rows, labels = data._parse_adult(text)
    assert labels == [0, 1]
    assert rows[1][1] == "?" and rows[1][-1] == "?" and len(rows[1]) == 14
    with pytest.raises(ValueError, match="malformed"):
        data._parse_adult("1, 2, 3\n")


def test_mnist5k_is_bundled_and_standardized() -> None:
    pool, test = load_dataset("mnist5k")
    assert pool.x.shape == (4000, 1, 28, 28) and test.x.shape == (1000, 1, 28, 28)
    assert abs(float(pool.x.mean())) < 1e-4 and abs(float(pool.x.std()) - 1.0) < 1e-4
    assert set(np.unique(pool.y)) == set(range(10))


def test_split_indices_is_seeded_and_disjoint() -> None:
    rest, held = split_indices(10, 0.2, seed=3)
    assert len(held) == 2 and len(rest) == 8
    assert sorted(np.concatenate([rest, held])) == list(range(10))
    assert np.array_equal(held, split_indices(10, 0.2, seed=3)[1])
    with pytest.raises(ValueError, match="fraction"):
        split_indices(10, 1.0, seed=0)
    with pytest.raises(ValueError, match="num_samples"):
        split_indices(1, 0.2, seed=0)


@pytest.mark.parametrize(
    "name, module, rows, features, classes, positive",
    [
        ("breast-cancer", "sklearn", 569, 30, 2, (0.6, 0.65)),
        ("digits", "sklearn", 1797, 64, 10, None),
        ("fair", "statsmodels", 6366, 8, 2, (0.31, 0.33)),
        ("randhie", "statsmodels", 20190, 9, 2, (0.49, 0.51)),
        ("anes96", "statsmodels", 944, 10, 2, (0.41, 0.42)),
    ],
)
def test_package_tables_read_offline_with_the_documented_shape(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    module: str,
    rows: int,
    features: int,
    classes: int,
    positive: tuple[float, float] | None,
) -> None:
    """The tables of the ``bench`` extra come from the installed package: no socket is opened (a connection would
    raise), 80/20 split, standardized on the pool, the documented labels (fair: affairs > 0, 32 %; randhie: mdvis
    > 1, 50 %; anes96: a vote for Dole, 42 %)."""
    pytest.importorskip(module)
    import socket

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"loading {name!r} tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    pool, test = load_dataset(name)
    assert (len(pool), len(test)) == (rows - round(0.2 * rows), round(0.2 * rows))
    assert pool.x.shape[1] == test.x.shape[1] == features and pool.num_classes == test.num_classes == classes
    assert pool.name == test.name == name and set(np.unique(pool.y)) == set(range(classes))
    np.testing.assert_allclose(pool.x.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(pool.x.std(axis=0)[pool.x.std(axis=0) > 0], 1.0, atol=1e-4)
    if positive is not None:
        share = np.concatenate([pool.y, test.y]).mean()
        assert positive[0] < share < positive[1]


def test_unknown_statsmodels_table_is_rejected() -> None:
    with pytest.raises(ValueError, match="name must be one of fair, randhie, anes96, randhie-3"):
        data.load_statsmodels_table("iris")


def test_randhie_3_cuts_the_visits_at_0_and_2() -> None:
    pytest.importorskip("statsmodels")
    two, three = data.load_statsmodels_table("randhie"), data.load_statsmodels_table("randhie-3")
    np.testing.assert_array_equal(two[0].x, three[0].x)
    # mdvis > 1 (two classes) is class 2 or mdvis = 2 (class 1) of the three
    assert three[0].num_classes == 3 and np.all(two[0].y[three[0].y == 2] == 1)
    assert np.all(three[0].y[two[0].y == 0] <= 1) and np.bincount(three[0].y).tolist() == [5052, 5295, 5805]


def test_a_table_variant_keeps_fewer_rows_or_flips_labels_never_the_test_set() -> None:
    pytest.importorskip("sklearn")
    pool, test = load_dataset("digits")
    small, small_test = load_dataset("digits-1k")
    assert len(small) == 1000 and small.name == "digits-1k" and small.num_classes == 10
    # every kept row is a pool row with its label (the features as the table standardized them)
    rows = {row.tobytes(): label for row, label in zip(pool.x, pool.y, strict=True)}
    assert all(rows[row.tobytes()] == label for row, label in zip(small.x, small.y, strict=True))
    noisy, noisy_test = load_dataset("digits-noisy")
    np.testing.assert_array_equal(noisy.x, pool.x)
    flipped = noisy.y != pool.y
    assert 0.26 < flipped.mean() < 0.34  # 30 % flipped, each to another class
    for held in (small_test, noisy_test):
        np.testing.assert_array_equal(held.y, test.y)
    with pytest.raises(ValueError, match="name must be one of digits-1k"):
        data.load_table_variant("digits-2k")
    pytest.importorskip("statsmodels")
    both = load_dataset("randhie-3-2k-noisy")[0]  # a variant of a variant: fewer rows, then flips
    assert len(both) == 2000 and both.num_classes == 3 and both.name == "randhie-3-2k-noisy"


def test_unknown_dataset_name_is_rejected_with_the_registered_names() -> None:
    known = ", ".join(data.dataset_names())
    assert known.startswith("adult, mnist5k") and "cifar10" in known
    for refuse in (lambda: load_dataset("imagenet"), lambda: data.dataset_spec("imagenet")):
        with pytest.raises(ValueError, match=f"dataset must be one of {known}, got 'imagenet'"):
            refuse()


def test_a_registered_dataset_is_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering a data set makes it loadable by name, with its model and epochs; a second entry of the same
    name and an entry with no epochs are refused."""
    from dphype.ml.torch_task import default_epochs, make_task

    monkeypatch.setattr(data, "_REGISTRY", data._REGISTRY.copy())
    rng = np.random.default_rng(0)
    pool = Dataset(rng.normal(size=(40, 3)), np.arange(40) % 2, 2, "toy")
    spec = data.register_dataset(data.DataSetSpec("toy", lambda _dir: (pool, pool), "adult-mlp", epochs=2))
    assert data.dataset_spec("toy") is spec and data.dataset_names()[-1] == "toy"
    assert load_dataset("toy")[0] is pool and default_epochs("toy") == 2
    task = make_task("toy", 1, 4, seed=3)
    assert (task.model, task.epochs, len(task.data)) == ("adult-mlp", 2, 10)
    with pytest.raises(ValueError, match="already registered"):
        data.register_dataset(spec)
    with pytest.raises(ValueError, match="epochs of dataset 'other' must be >= 1"):
        data.register_dataset(data.DataSetSpec("other", spec.load, "adult-mlp", epochs=0))


def test_the_registry_keeps_each_data_sets_model_and_epochs() -> None:
    table = {name: (data.dataset_spec(name).model, data.dataset_spec(name).epochs,
                    data.dataset_spec(name).needs_data_dir) for name in data.dataset_names()}
    assert table == {
        "adult": ("adult-mlp", 5, False), "mnist5k": ("mnist-cnn", 5, False), "mnist": ("mnist-cnn", 5, True),
        "fashion-mnist": ("mnist-cnn", 5, False), "cifar10": ("cifar-cnn", 10, True),
        "breast-cancer": ("adult-mlp", 5, False), "digits": ("adult-mlp", 5, False),
        "fair": ("adult-mlp", 5, False), "randhie": ("adult-mlp", 5, False),
        "anes96": ("adult-mlp", 5, False), "fashion-mnist-6k": ("adult-mlp", 5, False),
        "randhie-3": ("adult-mlp", 5, False), "digits-1k": ("adult-mlp", 5, False),
        "fair-1k": ("adult-mlp", 5, False), "randhie-1k": ("adult-mlp", 5, False),
        "digits-noisy": ("adult-mlp", 5, False), "fair-noisy": ("adult-mlp", 5, False),
        "anes96-noisy": ("adult-mlp", 5, False), "fair-2k-noisy": ("adult-mlp", 5, False),
        "randhie-3-2k-noisy": ("adult-mlp", 5, False),
    }


@pytest.mark.slow
@pytest.mark.skipif(not Path(data.FASHION_MNIST_DEFAULT_DIR).is_dir(),
                    reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_6k_is_600_pooled_images_per_class_and_the_official_test_set() -> None:
    pool, test = load_dataset("fashion-mnist-6k")
    assert pool.x.shape == (6000, 196) and test.x.shape == (10000, 196)
    assert pool.num_classes == test.num_classes == 10 and pool.name == test.name == "fashion-mnist-6k"
    assert np.bincount(pool.y).tolist() == [600] * 10 and np.bincount(test.y).tolist() == [1000] * 10
    np.testing.assert_allclose(pool.x.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(pool.x.std(axis=0), 1.0, atol=1e-3)
    # each feature is the mean of a 2 x 2 block: the official test images' first block, standardized alike
    _, full_test = data.load_idx_images("fashion-mnist", data.FASHION_MNIST_DEFAULT_DIR, ("FashionMNIST",))
    block = full_test.x[:, 0, :2, :2].mean(axis=(1, 2))
    assert np.corrcoef(block, test.x[:, 0])[0, 1] > 0.9999
    assert np.array_equal(load_dataset("fashion-mnist-6k")[0].y, pool.y)  # the same draw every time


# ------------------------------------------------------------------------------------------------
# IDX (MNIST / Fashion-MNIST) and CIFAR pickles, written to tmp folders


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">i4").tobytes()
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if path.suffix == ".gz" else payload)


def _write_mnist_like(folder: Path, n_train: int, n_test: int, gz: bool, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    train_x = rng.integers(0, 256, size=(n_train, 28, 28))
    _write_idx(folder / f"train-images-idx3-ubyte{suffix}", train_x)
    _write_idx(folder / f"train-labels-idx1-ubyte{suffix}", np.arange(n_train) % 10)
    _write_idx(folder / f"t10k-images-idx3-ubyte{suffix}", rng.integers(0, 256, size=(n_test, 28, 28)))
    _write_idx(folder / f"t10k-labels-idx1-ubyte{suffix}", np.arange(n_test) % 10)
    return train_x


def test_read_idx_round_trips_plain_and_gzip(tmp_path: Path) -> None:
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    for name in ("a-idx3-ubyte", "a-idx3-ubyte.gz"):
        _write_idx(tmp_path / name, array)
        np.testing.assert_array_equal(read_idx(tmp_path / name), array)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x01\x00")
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "bad")


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_loads_torchvision_layout(tmp_path: Path, gz: bool) -> None:
    train_x = _write_mnist_like(tmp_path / "MNIST" / "raw", n_train=30, n_test=10, gz=gz)
    pool, test = load_dataset("mnist", str(tmp_path))
    assert pool.x.shape == (30, 1, 28, 28) and test.x.shape == (10, 1, 28, 28)
    assert pool.name == "mnist" and pool.num_classes == 10
    np.testing.assert_array_equal(pool.y, np.arange(30) % 10)
    assert abs(float(pool.x.mean())) < 1e-4 and abs(float(pool.x.std()) - 1.0) < 1e-4
    # standardization is monotone per pixel value: ordering of the raw pixels is kept
    assert np.array_equal(np.argsort(pool.x[0].ravel(), kind="stable"), np.argsort(train_x[0].ravel(), kind="stable"))


def test_fashion_mnist_accepts_a_flat_folder(tmp_path: Path) -> None:
    _write_mnist_like(tmp_path, n_train=20, n_test=10, gz=True)
    pool, test = load_dataset("fashion-mnist", str(tmp_path))
    assert len(pool) == 20 and len(test) == 10 and pool.name == "fashion-mnist"


@pytest.mark.skipif(
    not os.path.isdir(data.FASHION_MNIST_DEFAULT_DIR), reason="Debian package dataset-fashion-mnist not installed"
)
def test_fashion_mnist_default_folder_has_the_debian_files() -> None:
    files = sorted(os.listdir(data.FASHION_MNIST_DEFAULT_DIR))
    assert {f"{stem}.gz" for stem in data._IDX_STEMS} <= set(files)
    labels = read_idx(Path(data.FASHION_MNIST_DEFAULT_DIR) / "t10k-labels-idx1-ubyte.gz")
    assert labels.shape == (10000,) and np.bincount(labels).tolist() == [1000] * 10


def test_missing_image_folders_say_where_and_what(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_dataset("mnist", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="data_dir"):
        load_dataset("mnist")
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        load_dataset("cifar10", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        load_dataset("cifar10")


def _write_cifar_batch(path: Path, n: int, rng: np.random.Generator) -> None:
    batch = {b"data": rng.integers(0, 256, size=(n, 3072)).astype(np.uint8), b"labels": list(np.arange(n) % 10)}
    with path.open("wb") as fh:
        pickle.dump(batch, fh)


def test_cifar10_loads_python_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(1, 6):
        _write_cifar_batch(folder / f"data_batch_{i}", 4, rng)
    _write_cifar_batch(folder / "test_batch", 6, rng)
    pool, test = load_dataset("cifar10", str(tmp_path))
    assert pool.x.shape == (20, 3, 32, 32) and test.x.shape == (6, 3, 32, 32)
    np.testing.assert_allclose(pool.x.mean(axis=(0, 2, 3)), 0.0, atol=1e-4)
    np.testing.assert_allclose(pool.x.std(axis=(0, 2, 3)), 1.0, atol=1e-4)
    assert pool.name == "cifar10" and pool.num_classes == 10


def test_dataset_validates_shapes_and_labels() -> None:
    with pytest.raises(ValueError, match="same number of rows"):
        Dataset(np.zeros((3, 2)), np.zeros(2), 2, "t")
    with pytest.raises(ValueError, match="labels"):
        Dataset(np.zeros((2, 2)), np.array([0, 2]), 2, "t")
    ds = Dataset(np.arange(6).reshape(3, 2), np.array([0, 1, 1]), 2, "t")
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64 and len(ds.subset(np.array([2]))) == 1


# ------------------------------------------------------------------------------------------------
# partitioners

LABELS = np.repeat(np.arange(4), [400, 300, 200, 103])  # 1003 samples, unbalanced labels


def _label_counts(parts: list[np.ndarray], labels: np.ndarray) -> np.ndarray:
    return np.stack([np.bincount(labels[p], minlength=labels.max() + 1) for p in parts])


def test_iid_partition_has_equal_sizes_and_label_mix() -> None:
    parts = partition_iid(LABELS, 10, seed=1)
    assert [len(p) for p in parts] == [100] * 10  # 3 left-over rows dropped
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)
    counts = _label_counts(parts, LABELS)
    assert np.all(counts.max(axis=0) - counts.min(axis=0) <= 1)


def test_iid_partition_is_seeded() -> None:
    a = partition_iid(LABELS, 7, seed=5)
    b = partition_iid(LABELS, 7, seed=5)
    c = partition_iid(LABELS, 7, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert [len(p) for p in partition_iid(25, 5, seed=0)] == [5] * 5


def test_iid_partition_rejects_bad_client_counts() -> None:
    with pytest.raises(ValueError, match="clients"):
        partition_iid(LABELS, 0, seed=0)
    with pytest.raises(ValueError, match="clients"):
        partition_iid(10, 11, seed=0)


def test_dirichlet_partition_covers_data_with_min_size_and_seeds() -> None:
    parts = partition_dirichlet(LABELS, 10, beta=1.0, seed=2, min_size=20)
    joined = np.concatenate(parts)
    assert sorted(joined) == list(range(len(LABELS)))
    assert min(len(p) for p in parts) >= 20
    assert len({len(p) for p in parts}) > 1  # sizes vary
    again = partition_dirichlet(LABELS, 10, beta=1.0, seed=2, min_size=20)
    assert all(np.array_equal(x, y) for x, y in zip(parts, again))


def _mean_label_distance(beta: float) -> float:
    """Average total-variation distance between client and global label distributions."""
    parts = partition_dirichlet(LABELS, 10, beta=beta, seed=0, min_size=5)
    counts = _label_counts(parts, LABELS)
    local = counts / counts.sum(axis=1, keepdims=True)
    overall = np.bincount(LABELS) / len(LABELS)
    return float(np.mean(0.5 * np.abs(local - overall).sum(axis=1)))


def test_dirichlet_label_skew_grows_as_beta_falls() -> None:
    skews = [_mean_label_distance(beta) for beta in (30.0, 5.0, 0.5)]
    assert skews[0] < skews[1] < skews[2]
    assert skews[0] < 0.1 and skews[2] > 0.3


def test_dirichlet_rejects_bad_beta_and_too_many_clients() -> None:
    for beta in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="beta"):
            partition_dirichlet(LABELS, 5, beta=beta, seed=0)
    with pytest.raises(ValueError, match="clients"):
        partition_dirichlet(LABELS, 101, beta=1.0, seed=0, min_size=10)
    with pytest.raises(ValueError, match="too many"):  # feasible in size, but beta=0.05 starves clients
        partition_dirichlet(LABELS, 90, beta=0.05, seed=0, min_size=10)


def test_flwr_partition_runs_any_flwr_datasets_partitioner() -> None:
    from datasets import Dataset as HFDataset
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner

    from dphype.ml.data import flwr_partition

    parts = flwr_partition(LABELS, IidPartitioner(num_partitions=4))  # contiguous shards of the table
    assert [len(p) for p in parts] == [251, 251, 251, 250]
    assert np.array_equal(np.concatenate(parts), np.arange(len(LABELS)))
    # partition_dirichlet gives exactly the shards flwr-datasets makes of the same labels
    ours = partition_dirichlet(LABELS, 6, beta=0.7, seed=3, min_size=10)
    theirs = DirichletPartitioner(num_partitions=6, partition_by="label", alpha=0.7, min_partition_size=10,
                                  self_balancing=False, seed=3)
    theirs.dataset = HFDataset.from_dict({"label": LABELS})
    for i, rows in enumerate(ours):
        assert np.array_equal(np.sort(theirs.load_partition(i)["label"]), np.sort(LABELS[rows]))
