"""Data sets and client partitioners for the paper's benchmarks (DP-Hype, Section V-B, Appendix C).

Every data set is one registered `DataSetSpec` (its loader, the paper's model for it, its epochs; see
`register_dataset`): `load_dataset` and every command take its name, and refuse an unregistered one with the list of
registered names. Loaders return ``(pool, test)``: ``pool`` is the training data that gets split among the clients,
``test`` is held out for the final model. Features are standardized (Section V-B: "data are
standardized"), Adult's categorical attributes are one-hot encoded and its label is
``income > 50K``.

* ``adult`` and ``mnist5k`` are bundled with the package (``dphype/data/``, see PROVENANCE.md).
  The paper merges Adult's two files (48,842 rows, Table II) and holds out 20 % for testing;
  mnist5k is split the same way.
* ``breast-cancer`` (569 rows, 30 features, 2 classes) and ``digits`` (1,797 8x8 digits as 64 features, 10
  classes) are the UCI tables scikit-learn ships offline (`load_sklearn_table`); ``fair`` (6,366 rows, 8
  features) and ``randhie`` (20,190 rows, 9 features), both binary, are tables statsmodels ships offline
  (`load_statsmodels_table`). All four come with the optional ``bench`` extra and are split and standardized like
  Adult: tasks that played no part in DP-Hype's design.
* ``mnist``, ``fashion-mnist`` and ``cifar10`` are read from a user folder in torchvision's on-disk
  format (IDX files / python pickles, read here with numpy) and keep their official train/test split.
  Fashion-MNIST defaults to Debian's ``dataset-fashion-mnist`` package folder.

Partitioners return one array of row indices per client: `partition_iid` (equal sizes,
near-identical label mix) and `partition_dirichlet` (label skew and varying sizes, Appendix C:
flwr-datasets' ``DirichletPartitioner``). `flwr_partition` runs any flwr-datasets partitioner over
in-memory labels. The iid split is written here: flwr-datasets' ``IidPartitioner`` cuts contiguous shards
of a shuffled table, which does not give every client the same label mix.
"""

from __future__ import annotations

import functools
import gzip
import importlib.resources
import pickle
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dphype.checks import check_positive
from dphype.registry import Registry

if TYPE_CHECKING:
    from flwr_datasets.partitioner import Partitioner

#: Where Debian's ``dataset-fashion-mnist`` package installs the IDX files.
FASHION_MNIST_DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"

#: Fraction of the merged Adult / mnist5k rows held out for testing (Section V-B).
TEST_FRACTION = 0.2

#: Seed of the fixed pool/test split of the bundled data sets.
SPLIT_SEED = 0

_ADULT_COLUMNS: tuple[tuple[str, bool], ...] = (  # (name, is_numeric), in file order; label follows
    ("age", True),
    ("workclass", False),
    ("fnlwgt", True),
    ("education", False),
    ("education-num", True),
    ("marital-status", False),
    ("occupation", False),
    ("relationship", False),
    ("race", False),
    ("sex", False),
    ("capital-gain", True),
    ("capital-loss", True),
    ("hours-per-week", True),
    ("native-country", False),
)
_ADULT_POSITIVE = ">50K"


@dataclass(eq=False)
class Dataset:
    """Features ``x`` (float32, first axis = samples) and integer labels ``y`` in ``[0, num_classes)``.

    Attributes:
        x: ``(N, C, H, W)`` images or ``(N, D)`` tabular features, float32.
        y: ``(N,)`` integer labels in ``[0, num_classes)``.
        num_classes: The number of classes, ``>= 2``.
        name: The data set's name.

    Raises:
        ValueError: ``x`` and ``y`` disagree in length, ``y`` is not 1-D, or a label or ``num_classes`` is out
            of range.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str

    def __post_init__(self) -> None:
        self.x = np.ascontiguousarray(self.x, dtype=np.float32)
        self.y = np.ascontiguousarray(self.y, dtype=np.int64)
        if self.y.ndim != 1 or self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"x and y must have the same number of rows and y must be 1-D, got x {self.x.shape}, "
                f"y {self.y.shape}"
            )
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        if self.y.size and (self.y.min() < 0 or self.y.max() >= self.num_classes):
            raise ValueError(f"labels must lie in [0, {self.num_classes}), got [{self.y.min()}, {self.y.max()}]")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: np.ndarray) -> Dataset:
        """The rows ``indices`` (a copy), with the same ``num_classes`` and ``name``."""
        return Dataset(self.x[indices], self.y[indices], self.num_classes, self.name)


# --------------------------------------------------------------------------------------------------
# loaders


@dataclass(frozen=True)
class DataSetSpec:
    """One registered data set: how to load it and what the paper trains on it.

    Attributes:
        name: The name commands and configurations use.
        load: ``load(data_dir)`` -> ``(pool, test)``; ``data_dir`` is ``None`` unless the user gave a folder.
        model: The model trained on it, a name of `dphype.ml.models.MODELS`.
        epochs: Local (and FedAvg) epochs the paper uses for it (Section V-B).
        needs_data_dir: Whether it is read only from a folder the user gives (not bundled, no default folder).
    """

    name: str
    load: Callable[[str | None], tuple[Dataset, Dataset]]
    model: str
    epochs: int = 5
    needs_data_dir: bool = False


_REGISTRY: Registry[DataSetSpec] = Registry("dataset", "dataset")


def register_dataset(spec: DataSetSpec) -> DataSetSpec:
    """Add ``spec`` to the data sets every command accepts; a taken name or ``epochs`` below 1 is refused."""
    if spec.epochs < 1:
        raise ValueError(f"epochs of dataset {spec.name!r} must be >= 1, got {spec.epochs}")
    return _REGISTRY.add(spec.name, spec)


def dataset_names() -> tuple[str, ...]:
    """The registered data sets' names, in registration order."""
    return _REGISTRY.names()


def dataset_spec(name: str) -> DataSetSpec:
    """The registered data set ``name``; an unknown name is refused with the list of registered ones."""
    return _REGISTRY.get(name)


def load_dataset(name: str, data_dir: str | None = None) -> tuple[Dataset, Dataset]:
    """``(pool, test)`` of the registered data set ``name``.

    Args:
        name: One of `dataset_names`.
        data_dir: The folder holding a non-bundled data set (``mnist``, ``cifar10``; optional for
            ``fashion-mnist``); the bundled ones do not read it.

    Returns:
        ``(pool, test)``.

    Raises:
        ValueError: ``name`` is unknown.
        FileNotFoundError: A non-bundled data set's files are missing (the message names them).
    """  # noqa: DOC502, DOC503
    return dataset_spec(name).load(data_dir)


def _bundled(filename: str) -> bytes:
    """Uncompressed content of a file bundled in ``dphype/data/``."""
    raw = importlib.resources.files("dphype").joinpath("data", filename).read_bytes()
    return gzip.decompress(raw) if filename.endswith(".gz") else raw


def split_indices(num_samples: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random split of ``range(num_samples)`` into ``(rest, held_out)``, sorted.

    Args:
        num_samples: The number of rows, ``>= 2``.
        fraction: The held-out fraction, in ``(0, 1)``.
        seed: Seeds the split.

    Returns:
        ``(rest, held_out)``: sorted index arrays; ``held_out`` has ``round(fraction * num_samples)`` rows, at
        least one, and ``rest`` keeps at least one.

    Raises:
        ValueError: ``fraction`` or ``num_samples`` is out of its range.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie in (0, 1), got {fraction}")
    if num_samples < 2:
        raise ValueError(f"num_samples must be >= 2 to split off a held-out part, got {num_samples}")
    held = min(max(1, round(fraction * num_samples)), num_samples - 1)
    perm = np.random.default_rng(seed).permutation(num_samples)
    return np.sort(perm[held:]), np.sort(perm[:held])


def _parse_adult(text: str) -> tuple[list[list[str]], list[int]]:
    """Rows of raw attribute strings and 0/1 labels; skips blank and ``|`` comment lines."""
    rows: list[list[str]] = []
    labels: list[int] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("|"):
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != len(_ADULT_COLUMNS) + 1:
            raise ValueError(f"malformed Adult row with {len(fields)} fields: {line[:80]!r}")
        rows.append(fields[:-1])
        labels.append(int(fields[-1].rstrip(".") == _ADULT_POSITIVE))
    return rows, labels


def load_adult() -> tuple[Dataset, Dataset]:
    """UCI Adult as ``(pool, test)``: 39,074 and 9,768 of the 48,842 rows (Section V-B, Table II).

    Both original files are merged and split 80/20 with `SPLIT_SEED`. Numeric attributes are
    standardized with the pool's mean and standard deviation; categorical attributes are one-hot
    encoded over the sorted values seen in all rows, with the missing value ``?`` kept as a category
    of its own. Label: 1 iff income > 50K.

    Returns:
        ``(pool, test)``.
    """
    rows, labels = _parse_adult(_bundled("adult.data.gz").decode("ascii"))
    test_rows, test_labels = _parse_adult(_bundled("adult.test.gz").decode("ascii"))
    rows += test_rows
    labels += test_labels
    table = np.array(rows, dtype=object)
    pool_idx, test_idx = split_indices(len(rows), TEST_FRACTION, SPLIT_SEED)
    blocks: list[np.ndarray] = []
    for col, (_name, numeric) in enumerate(_ADULT_COLUMNS):
        if numeric:
            values = table[:, col].astype(np.float64)[:, None]
            mean, std = values[pool_idx].mean(), values[pool_idx].std()
            blocks.append((values - mean) / std)
        else:
            categories = np.array(sorted(set(table[:, col])), dtype=object)
            blocks.append((table[:, col][:, None] == categories[None, :]).astype(np.float64))
    x = np.concatenate(blocks, axis=1)
    y = np.array(labels, dtype=np.int64)
    return (
        Dataset(x[pool_idx], y[pool_idx], 2, "adult"),
        Dataset(x[test_idx], y[test_idx], 2, "adult"),
    )


#: The scikit-learn loader of each table `load_sklearn_table` reads (both UCI, CC BY 4.0).
SKLEARN_TABLES: dict[str, str] = {"breast-cancer": "load_breast_cancer", "digits": "load_digits"}


def load_sklearn_table(name: str) -> tuple[Dataset, Dataset]:
    """A table scikit-learn ships offline as ``(pool, test)``, split 80/20 with `SPLIT_SEED` like Adult.

    ``breast-cancer``: UCI Breast Cancer Wisconsin (Diagnostic), Wolberg, Street & Mangasarian (CC BY 4.0), 569
    rows, label 1 = benign. ``digits``: UCI Optical Recognition of Handwritten Digits, Alpaydin & Kaynak (CC BY
    4.0), 1,797 rows of 64 pixel counts in [0, 16]. Every feature is standardized with the pool's mean and
    standard deviation (a feature constant on the pool is only centred).

    Args:
        name: A key of `SKLEARN_TABLES`.

    Returns:
        ``(pool, test)``.

    Raises:
        ValueError: ``name`` is not a key of `SKLEARN_TABLES`.
        ModuleNotFoundError: scikit-learn is not installed (the message names the extra to install).
    """
    if name not in SKLEARN_TABLES:
        raise ValueError(f"name must be one of {', '.join(SKLEARN_TABLES)}; got {name!r}")
    try:
        # lazy import: scikit-learn (bench extra)
        from sklearn import datasets
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f"dataset {name!r} is read from scikit-learn: pip install 'dphype[bench]' "
                                  "(or scikit-learn)") from err
    bunch = getattr(datasets, SKLEARN_TABLES[name])()
    return _split_table(np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64), name)


#: The statsmodels data set of each table `load_statsmodels_table` reads, with the outcome count and the thresholds
#: it is cut at: ``(module, outcome, thresholds)``, the label is the number of thresholds the outcome exceeds.
STATSMODELS_TABLES: dict[str, tuple[str, str, tuple[float, ...]]] = {
    "fair": ("fair", "affairs", (0.0,)),
    "randhie": ("randhie", "mdvis", (1.0,)),
    "anes96": ("anes96", "vote", (0.0,)),
    "randhie-3": ("randhie", "mdvis", (0.0, 2.0)),
}


def load_statsmodels_table(name: str) -> tuple[Dataset, Dataset]:
    """A table statsmodels ships offline as ``(pool, test)``, split 80/20 with `SPLIT_SEED` like Adult.

    ``fair``: Fair (1978), "A Theory of Extramarital Affairs" (Journal of Political Economy; statsmodels: "Included
    with permission of the author"), 6,366 rows, 8 features, label 1 = ``affairs > 0``. ``randhie``: the RAND Health
    Insurance Experiment (public domain; Cameron & Trivedi 2005), 20,190 person-years, 9 features, label 1 =
    ``mdvis > 1``, more physician visits than the median (``mdvis > 0`` would be too unbalanced for candidates to
    differ). ``anes96``: the American National Election Studies' 1996 survey (public domain), 944 respondents, 10
    features, label 1 = voted for Dole. ``randhie-3``: the RAND table with three classes, no physician visit, 1 to 2,
    3 or more (6,308, 6,614 and 7,268 person-years). The split is by row (one person's years may fall on both
    sides). Features standardized on the pool.

    Args:
        name: A key of `STATSMODELS_TABLES`.

    Returns:
        ``(pool, test)``.

    Raises:
        ValueError: ``name`` is not a key of `STATSMODELS_TABLES`.
        ModuleNotFoundError: statsmodels is not installed (the message names the extra to install).
    """
    if name not in STATSMODELS_TABLES:
        raise ValueError(f"name must be one of {', '.join(STATSMODELS_TABLES)}; got {name!r}")
    try:
        # lazy import: statsmodels (bench extra)
        import statsmodels.datasets
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f"dataset {name!r} is read from statsmodels: pip install 'dphype[bench]' "
                                  "(or statsmodels)") from err
    module, outcome, thresholds = STATSMODELS_TABLES[name]
    frame = getattr(statsmodels.datasets, module).load_pandas().data
    x = frame.drop(columns=outcome).to_numpy(dtype=np.float64)
    values = frame[outcome].to_numpy(dtype=np.float64)
    y = sum((values > t).astype(np.int64) for t in thresholds)
    return _split_table(x, np.asarray(y, dtype=np.int64), name)


#: Variants of registered tables with a weaker local signal (`load_table_variant`): ``name -> (table, pool rows,
#: share of pool labels flipped)``; ``None`` rows keeps the whole pool.
TABLE_VARIANTS: dict[str, tuple[str, int | None, float]] = {
    "digits-1k": ("digits", 1000, 0.0),
    "fair-1k": ("fair", 1000, 0.0),
    "randhie-1k": ("randhie", 1000, 0.0),
    "digits-noisy": ("digits", None, 0.3),
    "fair-noisy": ("fair", None, 0.2),
    "anes96-noisy": ("anes96", None, 0.2),
    "fair-2k-noisy": ("fair", 2000, 0.2),
    "randhie-3-2k-noisy": ("randhie-3", 2000, 0.2),
}


def _variant_loader(name: str, _dir: str | None) -> tuple[Dataset, Dataset]:
    return load_table_variant(name)


def load_table_variant(name: str) -> tuple[Dataset, Dataset]:
    """A registered table with fewer pool rows or noisy pool labels, as ``(pool, test)``.

    The pool keeps ``rows`` of the table's pool rows drawn with `SPLIT_SEED` (20 per client at n = 50 for 1,000
    rows); then each pool label is flipped with probability ``share`` to another class drawn uniformly. Features stay
    as the table standardized them; the test set is the table's, whole and with its true labels.

    Args:
        name: A key of `TABLE_VARIANTS`.

    Returns:
        ``(pool, test)``.

    Raises:
        ValueError: ``name`` is not a key of `TABLE_VARIANTS`, or ``rows`` exceeds the table's pool.
    """
    if name not in TABLE_VARIANTS:
        raise ValueError(f"name must be one of {', '.join(TABLE_VARIANTS)}; got {name!r}")
    table, rows, share = TABLE_VARIANTS[name]
    pool, test = load_dataset(table)
    rng = np.random.default_rng(SPLIT_SEED)
    if rows is not None:
        if rows > len(pool):
            raise ValueError(f"rows of variant {name!r} must be at most {len(pool)} (the pool of {table}), got {rows}")
        pool = pool.subset(np.sort(rng.choice(len(pool), rows, replace=False)))
    y = pool.y.copy()
    flipped = rng.random(len(y)) < share
    y[flipped] = (y[flipped] + rng.integers(1, pool.num_classes, int(flipped.sum()))) % pool.num_classes
    return Dataset(pool.x, y, pool.num_classes, name), Dataset(test.x, test.y, test.num_classes, name)


def _split_table(x: np.ndarray, y: np.ndarray, name: str) -> tuple[Dataset, Dataset]:
    """``(pool, test)`` of a numeric table split 80/20, standardized on the pool (constant features only centred)."""
    pool_idx, test_idx = split_indices(len(y), TEST_FRACTION, SPLIT_SEED)
    pool_x, test_x = _standardize_columns(x[pool_idx], x[test_idx])
    classes = int(y.max()) + 1
    return Dataset(pool_x, y[pool_idx], classes, name), Dataset(test_x, y[test_idx], classes, name)


def _standardize_columns(pool: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both tables standardized per column by the pool's mean and std (a column constant on the pool: centred)."""
    mean, std = pool.mean(axis=0), pool.std(axis=0)
    scale = np.where(std > 0, std, 1.0)
    return (pool - mean) / scale, (test - mean) / scale


def _standardize_images(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale uint8 ``(N, C, H, W)`` images to [0, 1], then standardize per channel with train statistics."""
    train_f = train.astype(np.float32) / 255.0
    test_f = test.astype(np.float32) / 255.0
    mean = train_f.mean(axis=(0, 2, 3), keepdims=True)
    std = train_f.std(axis=(0, 2, 3), keepdims=True)
    return (train_f - mean) / std, (test_f - mean) / std


def load_mnist5k() -> tuple[Dataset, Dataset]:
    """The bundled 5,000-digit MNIST subset as ``(pool, test)``, split 80/20 with `SPLIT_SEED`."""
    table = np.loadtxt(_bundled("mnist_5k.csv.gz").decode().splitlines(), delimiter=",", dtype=np.uint8)
    images = table[:, :-1].reshape(-1, 1, 28, 28)
    labels = table[:, -1].astype(np.int64)
    pool_idx, test_idx = split_indices(len(labels), TEST_FRACTION, SPLIT_SEED)
    pool_x, test_x = _standardize_images(images[pool_idx], images[test_idx])
    return Dataset(pool_x, labels[pool_idx], 10, "mnist5k"), Dataset(test_x, labels[test_idx], 10, "mnist5k")


#: Training images per class in the pool of ``fashion-mnist-6k`` (`load_fashion_mnist_6k`).
FASHION_6K_PER_CLASS = 600


def load_fashion_mnist_6k(data_dir: str | None) -> tuple[Dataset, Dataset]:
    """A small tabular Fashion-MNIST for an MLP: 6,000 pooled images as ``(pool, test)``.

    Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, Zalando Research; MIT licence), read by `load_idx_images`. The pool
    is `FASHION_6K_PER_CLASS` official training images of each of the 10 classes, drawn with `SPLIT_SEED`; the test
    set is the official 10,000 test images. Every image is average-pooled over 2 x 2 pixels to 14 x 14 = 196
    features, standardized with the pool's mean and standard deviation.

    Args:
        data_dir: The folder holding the IDX files; ``None``: `FASHION_MNIST_DEFAULT_DIR`.

    Returns:
        ``(pool, test)``.

    Raises:
        FileNotFoundError: The IDX files are not found (the message names them).
    """  # noqa: DOC502
    full, test = load_idx_images("fashion-mnist", FASHION_MNIST_DEFAULT_DIR if data_dir is None else data_dir,
                                 ("FashionMNIST",))
    rng = np.random.default_rng(SPLIT_SEED)
    rows = np.sort(np.concatenate([rng.choice(np.flatnonzero(full.y == c), FASHION_6K_PER_CLASS, replace=False)
                                   for c in range(full.num_classes)]))

    def pooled(images: np.ndarray) -> np.ndarray:
        blocks = images.astype(np.float64).reshape(len(images), 14, 2, 14, 2)
        return blocks.mean(axis=(2, 4)).reshape(len(images), -1)

    pool_x, test_x = _standardize_columns(pooled(full.x[rows]), pooled(test.x))
    name = "fashion-mnist-6k"
    return Dataset(pool_x, full.y[rows], 10, name), Dataset(test_x, test.y, 10, name)


def read_idx(path: str | Path) -> np.ndarray:
    """Array stored in an IDX file (the MNIST format; gzip-compressed when the name ends in ``.gz``).

    Layout: two zero bytes, a type byte (0x08 = uint8), the number of dimensions, one big-endian
    int32 per dimension, then the values in C order.

    Args:
        path: The IDX file.

    Returns:
        The uint8 array, of the shape the header announces.

    Raises:
        ValueError: The file is not an unsigned-byte IDX file or holds fewer values than announced.
    """
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    if len(raw) - offset != int(np.prod(shape)):
        raise ValueError(f"{path}: header announces shape {shape} but holds {len(raw) - offset} values")
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(shape)


_IDX_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def load_idx_images(name: str, data_dir: str | None, torchvision_folders: Sequence[str]) -> tuple[Dataset, Dataset]:
    """MNIST-format data set (official train/test split) from ``data_dir``.

    Args:
        name: The data set's name.
        data_dir: The folder holding the four IDX files (optionally ``.gz``); ``None`` fails.
        torchvision_folders: Folder names (e.g. ``MNIST``): the files are looked up in
            ``<data_dir>/<folder>/raw`` for each, then directly in ``data_dir``.

    Returns:
        ``(pool, test)``: the official train and test split.

    Raises:
        FileNotFoundError: ``data_dir`` is ``None`` or the files are not found (the message names them).
    """
    if data_dir is None:
        raise FileNotFoundError(
            f"{name} is not bundled: pass data_dir=<folder> holding its IDX files (optionally .gz)\n"
            f"the files: {', '.join(_IDX_STEMS)}, directly in the folder or in "
            f"<folder>/{torchvision_folders[0]}/raw (torchvision layout)"
        )
    root = Path(data_dir)
    searched = [root / folder / "raw" for folder in torchvision_folders] + [root]
    for folder in searched:
        files = [_first_existing(folder, stem) for stem in _IDX_STEMS]
        if all(f is not None for f in files):
            train_x, train_y, test_x, test_y = (read_idx(f) for f in files if f is not None)
            pool_x, held_x = _standardize_images(train_x[:, None], test_x[:, None])
            return (
                Dataset(pool_x, train_y.astype(np.int64), 10, name),
                Dataset(held_x, test_y.astype(np.int64), 10, name),
            )
    raise FileNotFoundError(
        f"{name}: IDX files {', '.join(_IDX_STEMS)} (optionally .gz) not found in any of "
        f"{', '.join(str(p) for p in searched)}"
    )


def _first_existing(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


_CIFAR_FOLDER = "cifar-10-batches-py"
_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST = "test_batch"


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(N, 3, 32, 32)`` uint8 images and labels of one CIFAR-10 pickle batch (trusted input, as in torchvision)."""
    with path.open("rb") as fh:
        batch = pickle.load(fh, encoding="bytes")
    images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return images, np.asarray(batch[b"labels"], dtype=np.int64)


def load_cifar10(data_dir: str | None) -> tuple[Dataset, Dataset]:
    """CIFAR-10 (official 50,000/10,000 split) from ``<data_dir>/cifar-10-batches-py`` or ``data_dir``.

    Args:
        data_dir: The folder holding the python batches; ``None`` fails.

    Returns:
        ``(pool, test)``.

    Raises:
        FileNotFoundError: ``data_dir`` is ``None`` or the batches are not found (the message names them).
    """
    expected = f"{', '.join(_CIFAR_TRAIN)}, {_CIFAR_TEST} (python pickles of the CIFAR-10 python version)"
    if data_dir is None:
        raise FileNotFoundError(
            f"cifar10 is not bundled: pass data_dir=<folder> holding {_CIFAR_FOLDER}/ with {expected}"
        )
    root = Path(data_dir)
    for folder in (root / _CIFAR_FOLDER, root):
        if all((folder / f).is_file() for f in (*_CIFAR_TRAIN, _CIFAR_TEST)):
            parts = [_read_cifar_batch(folder / f) for f in _CIFAR_TRAIN]
            test_x, test_y = _read_cifar_batch(folder / _CIFAR_TEST)
            pool_x, held_x = _standardize_images(np.concatenate([p[0] for p in parts]), test_x)
            pool_y = np.concatenate([p[1] for p in parts])
            return Dataset(pool_x, pool_y, 10, "cifar10"), Dataset(held_x, test_y, 10, "cifar10")
    raise FileNotFoundError(f"cifar10: {expected} not found in {root / _CIFAR_FOLDER} or {root}")


for _spec in (
    DataSetSpec("adult", lambda _dir: load_adult(), "adult-mlp"),
    DataSetSpec("mnist5k", lambda _dir: load_mnist5k(), "mnist-cnn"),
    DataSetSpec("mnist", lambda d: load_idx_images("mnist", d, ("MNIST",)), "mnist-cnn", needs_data_dir=True),
    DataSetSpec("fashion-mnist", lambda d: load_idx_images(
        "fashion-mnist", FASHION_MNIST_DEFAULT_DIR if d is None else d, ("FashionMNIST",)), "mnist-cnn"),
    DataSetSpec("cifar10", load_cifar10, "cifar-cnn", epochs=10, needs_data_dir=True),
    DataSetSpec("breast-cancer", lambda _dir: load_sklearn_table("breast-cancer"), "adult-mlp"),
    DataSetSpec("digits", lambda _dir: load_sklearn_table("digits"), "adult-mlp"),
    DataSetSpec("fair", lambda _dir: load_statsmodels_table("fair"), "adult-mlp"),
    DataSetSpec("randhie", lambda _dir: load_statsmodels_table("randhie"), "adult-mlp"),
    DataSetSpec("anes96", lambda _dir: load_statsmodels_table("anes96"), "adult-mlp"),
    DataSetSpec("fashion-mnist-6k", load_fashion_mnist_6k, "adult-mlp"),
    DataSetSpec("randhie-3", lambda _dir: load_statsmodels_table("randhie-3"), "adult-mlp"),
    *(DataSetSpec(name, functools.partial(_variant_loader, name), "adult-mlp") for name in TABLE_VARIANTS),
):
    register_dataset(_spec)


# --------------------------------------------------------------------------------------------------
# partitioners


def _check_clients(clients: int, num_samples: int, min_size: int) -> None:
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    if clients * min_size > num_samples:
        raise ValueError(
            f"clients must be <= {num_samples // min_size} for {num_samples} samples and at least "
            f"{min_size} per client, got {clients}"
        )


def partition_iid(labels: np.ndarray | int, clients: int, seed: int) -> list[np.ndarray]:
    """IID split (Section V-C): equal client sizes and a near-identical label mix.

    Every client gets ``N // clients`` rows (the rest dropped at random); the kept rows are shuffled with ``seed``,
    stably sorted by label and dealt round-robin, so each client's count of every label differs from the others' by
    at most one.

    Args:
        labels: The ``(N,)`` label array, or a sample count ``N`` (no labels).
        clients: The number of clients, in ``[1, N]``.
        seed: Seeds the shuffle.

    Returns:
        One sorted index array per client.

    Raises:
        ValueError: ``clients`` is out of its range.
    """  # noqa: DOC502
    y = np.zeros(labels, dtype=np.int64) if isinstance(labels, (int, np.integer)) else np.asarray(labels)
    _check_clients(clients, len(y), 1)
    per_client = len(y) // clients
    kept = np.random.default_rng(seed).permutation(len(y))[: per_client * clients]
    dealt = kept[np.argsort(y[kept], kind="stable")]
    return [np.sort(dealt[c::clients]) for c in range(clients)]


def flwr_partition(labels: np.ndarray, partitioner: Partitioner) -> list[np.ndarray]:
    """Row indices of every partition a configured flwr-datasets ``partitioner`` makes of in-memory labels.

    The partitioner gets a ``datasets.Dataset`` with the columns ``label`` and ``row`` (the row index) in Arrow
    format (a column reads as one Arrow array, not row by row), so the features never leave numpy and any
    flwr-datasets partitioning plugs in.

    Args:
        labels: The ``(N,)`` labels.
        partitioner: A configured flwr-datasets partitioner.

    Returns:
        One sorted index array per partition.
    """
    # lazy import: Hugging Face datasets
    from datasets import Dataset as HFDataset

    y = np.asarray(labels)
    table = HFDataset.from_dict({"label": y, "row": np.arange(len(y), dtype=np.int64)})
    partitioner.dataset = table.with_format("arrow")
    return [np.sort(np.asarray(partitioner.load_partition(i)["row"], dtype=np.int64))
            for i in range(partitioner.num_partitions)]


def partition_dirichlet(
    labels: np.ndarray,
    clients: int,
    beta: float,
    seed: int,
    min_size: int = 10,
) -> list[np.ndarray]:
    """Non-iid split by label (Section V-C, Appendix C): label skew plus varying client sizes.

    flwr-datasets' ``DirichletPartitioner`` (Hsu et al. 2019, without its self-balancing, as in the paper)
    via `flwr_partition`: for each label the proportions ``p ~ Dirichlet(beta * 1_clients)`` split
    that label's rows among the clients; smaller ``beta`` means stronger skew. The draw is repeated until
    every client holds at least ``min_size`` rows.

    Args:
        labels: The ``(N,)`` labels.
        clients: The number of clients.
        beta: The Dirichlet concentration, ``> 0``.
        seed: Seeds the draws.
        min_size: The fewest rows per client, ``>= 1``.

    Returns:
        One sorted index array per client.

    Raises:
        ValueError: An argument is out of its range, or after flwr-datasets' 10 tries the data cannot support
            that many clients.
    """
    # lazy import: Flower Datasets
    from flwr_datasets.partitioner import DirichletPartitioner

    y = np.asarray(labels)
    check_positive("beta", beta)
    if min_size < 1:
        raise ValueError(f"min_size must be >= 1, got {min_size}")
    _check_clients(clients, len(y), min_size)
    partitioner = DirichletPartitioner(num_partitions=clients, partition_by="label", alpha=float(beta),
                                       min_partition_size=min_size, self_balancing=False, shuffle=True, seed=seed)
    try:
        with warnings.catch_warnings():  # it warns on every failed try; the outcome is reported below
            warnings.simplefilter("ignore")
            return flwr_partition(y, partitioner)
    except ValueError as err:
        if "max number of attempts" not in str(err):
            raise
        raise ValueError(
            f"clients={clients} is too many for beta={beta}: use fewer clients or a larger beta\n"
            f"no Dirichlet draw in flwr-datasets' 10 tries gave every client >= {min_size} of the {len(y)} "
            "samples") from err
