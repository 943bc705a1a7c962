"""Run configuration of the bundled Flower app (``[tool.flwr.app.config]`` in pyproject.toml).

``flwr run`` fills the run config from pyproject.toml plus ``--run-config`` overrides; keys use dashes
there (``fedavg-rounds``) and underscores here. The DP-Hype keys (epsilon, delta, k, clients, dropout,
noise, accountant) form a `dphype.config.DPHypeConfig`; the rest configure this app.
Every key is validated here, on the server, before any client works; an unknown key is named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dphype.checks import check_epsilon_budget, check_int, check_positive, check_probability
from dphype.config import RUN_CONFIG_KEYS, DPHypeConfig, read_run_config
from dphype.flower.final_training import TrainingBudget
from dphype.ml.torch_task import check_candidates
from dphype.privacy.evaluation import DEFAULT_EVALUATION_SHARE, check_share
from dphype.secure.committee import COMMITTEE_SIZE
from dphype.selection.candidates import CandidateList, load_candidates
from dphype.selection.plan_result import WARN_BELOW

#: Data sets every node can load without a data directory (bundled, or Debian's Fashion-MNIST package).
APP_DATASETS: tuple[str, ...] = ("adult", "mnist5k", "fashion-mnist")
#: The app's release when the run config names none: only the winner (docs/deployment.md, "Default release: the winner
#: only"). The library's default stays ``"sum"`` (`dphype.config.DPHypeConfig`), which needs no tally
#: nodes.
APP_RELEASE = "argmax"
#: The bundled app's ``min-success``: the planner's warning threshold.
APP_MIN_SUCCESS = WARN_BELOW


def result_path(result_file: str) -> Path | None:
    """The run config's ``result-file`` as an absolute path on the ServerApp's host, checked; ``None`` when empty.

    A relative path is relative to the ServerApp process's working folder (in a deployment, the SuperLink's).

    Args:
        result_file: The run config's ``result-file``.

    Returns:
        The absolute path, or ``None`` for an empty ``result_file``.

    Raises:
        ValueError: If its folder does not exist there, or the path is a folder.
    """
    if not result_file:
        return None
    path = Path(result_file).expanduser().absolute()
    if not path.parent.is_dir() or path.is_dir():
        raise ValueError(f"result-file={result_file!r}: not a file in an existing folder; give such a path, or leave "
                         f"it empty\n({path} on the ServerApp's host, the SuperLink's in a deployment): its folder "
                         "must exist there and the path must name a file; give an absolute path in an existing folder "
                         "of that host")
    return path


@dataclass(frozen=True)
class AppConfig:
    """Everything one run of the bundled app needs: DP-Hype's selection, then FedAvg with the winner.

    Attributes:
        dphype: The selection's configuration.
        dataset: One of `APP_DATASETS`.
        candidates: A candidate spec (`dphype.selection.candidates.load_candidates`).
        seed: The seed of the data split and the training.
        fedavg_rounds: FedAvg's rounds with the winner.
        local_epochs: Each client's epochs per FedAvg round.
        fraction_evaluate: The share of nodes that evaluate the global model after each FedAvg round (0: only
            the server's evaluation).
        train_epsilon: The final training's budget (`dphype.flower.private_training`, composed with the selection;
            0: ordinary FedAvg, whose plaintext updates no guarantee covers).
        clipping_norm: The update clipping norm of private training.
        clipping: Who clips in private training, ``"server"`` or ``"client"``.
        connect_timeout: Seconds to wait for ``clients`` nodes to connect.
        round_timeout: Seconds per pre-flight, SecAgg+ stage and FedAvg round (a vanished node counts as dropped).
        tally_timeout: Seconds the tallies' MPyC parties have to check the ballots and open the result.
        result_file: Where the ServerApp also writes its summary as JSON (empty: nowhere).
        runs_dir: The folder of the run folders on the ServerApp's host (`dphype.runs.runs_dir`; empty: ``runs``,
            and under ``dphype run`` the app folder's ``runs/``).
        tallies: The size of the tally committee found among the connected nodes (committee releases only).
        private_evaluation: Whether the voters evaluate the final model privately after the training
            (`dphype.flower.PrivateEvaluation`: held-out accuracy and majority-class baseline, noisy, composed with
            the run's guarantee); ``false`` spends nothing on it.
        evaluation_share: The private evaluation's share of ``epsilon``, spent on top of the selection, in ``(0, 1]``.

    Raises:
        ValueError: If a field is invalid (named by its run-config key), the candidate spec cannot be loaded, or
            ``fraction_evaluate > 0`` with private training.
    """

    dphype: DPHypeConfig
    dataset: str = "adult"
    candidates: str = "table3"
    seed: int = 0
    fedavg_rounds: int = 5
    local_epochs: int = 5
    fraction_evaluate: float = 1.0
    train_epsilon: float = 0.0
    clipping_norm: float = 1.0
    clipping: str = "server"
    connect_timeout: float = 600.0
    round_timeout: float = 1800.0
    tally_timeout: float = 60.0
    result_file: str = ""
    runs_dir: str = ""
    tallies: int = COMMITTEE_SIZE
    private_evaluation: bool = True
    evaluation_share: float = DEFAULT_EVALUATION_SHARE

    def __post_init__(self) -> None:
        if self.dataset not in APP_DATASETS:
            raise ValueError(f"dataset must be one of {', '.join(APP_DATASETS)}, got {self.dataset!r}")
        check_int("seed", self.seed, 0)
        check_int("tallies", self.tallies, 3)
        for name in ("fedavg_rounds", "local_epochs"):
            check_int(name.replace("_", "-"), getattr(self, name), 1)
        for name in ("connect_timeout", "round_timeout", "tally_timeout"):
            check_positive(name.replace("_", "-"), getattr(self, name))
        check_probability("fraction-evaluate", self.fraction_evaluate)
        if not isinstance(self.private_evaluation, bool):
            raise ValueError(f"private-evaluation must be true or false, got {self.private_evaluation!r}")
        if self.private_evaluation:
            check_share(self.evaluation_share, "evaluation-share")
        if self.train_epsilon != 0.0:
            check_epsilon_budget(self.train_epsilon, "train-epsilon")
            self.training_budget()  # validates train-epsilon, clipping-norm and clipping
            if self.fraction_evaluate > 0.0:
                raise ValueError("fraction-evaluate must be 0 when train-epsilon > 0: set fraction-evaluate = 0\n"
                                 "the clients' evaluation metrics would leave them in plaintext, outside the training "
                                 "guarantee")
        try:  # a bad spec, or candidates the app's task cannot train, are refused here, before any client works
            check_candidates(self.candidate_list())
        except ValueError as err:
            raise ValueError(f"run config candidates={self.candidates!r}: {err}\nThe bundled app's {self.dataset} "
                             "task is the SGD training the nodes run: set candidates to a list with only the keys "
                             "it reads, e.g. candidates='table3'") from None
        if self.result_file:
            self.result_path()  # its folder must exist on the ServerApp's host before the run spends anything

    def result_path(self) -> Path | None:
        """Where the ServerApp writes its summary (`result_path` of ``result_file``)."""
        return result_path(self.result_file)

    def training_budget(self) -> TrainingBudget | None:
        """The DP final-training budget, or ``None`` for ordinary FedAvg (``train-epsilon = 0``)."""
        if self.train_epsilon == 0.0:
            return None
        return TrainingBudget(epsilon=self.train_epsilon, rounds=self.fedavg_rounds, clipping_norm=self.clipping_norm,
                              clipping=self.clipping)

    def candidate_list(self) -> CandidateList:
        """The public candidate list loaded from ``candidates``."""
        return load_candidates(self.candidates)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> AppConfig:
        """Parse a Flower run config; unknown keys are refused by name.

        ``release`` defaults to `APP_RELEASE` and ``min-success`` to `APP_MIN_SUCCESS` (the bundled app refuses a
        federation too small to select); the other DP-Hype keys to `dphype.config.DPHypeConfig`'s defaults.

        Args:
            run_config: The Flower run config (dashed keys).

        Returns:
            The validated app configuration.

        Raises:
            ValueError: If a key is unknown or missing, or a value is invalid.
        """
        run_config = {"release": APP_RELEASE, "min-success": APP_MIN_SUCCESS, **run_config}
        own = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls) if f.name != "dphype"}
        unknown = sorted(set(run_config) - set(own) - set(RUN_CONFIG_KEYS.values()))
        if unknown:
            raise ValueError(f"unknown run-config keys: {', '.join(unknown)} (known: "
                             f"{', '.join(sorted([*own, *RUN_CONFIG_KEYS.values()]))})")
        values = read_run_config(cls, run_config, {field.name: key for key, field in own.items()})
        return cls(dphype=DPHypeConfig.from_run_config(run_config), **values)
