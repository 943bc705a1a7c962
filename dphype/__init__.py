"""dphype: DP-Hype, federated differentially private hyperparameter search for Flower.

Every client scores each public candidate on its own data and votes for its best ones (Liebenow, Peinemann,
Mohammadi: DP-Hype, Algorithm 1); the release mode decides what the server learns (`dphype.release`): the winner's
index alone, from a secure argmax among tally parties (the bundled app's default), the noisy vote sum over SecAgg+
(the paper's, `DPHypeConfig`'s default), or the noisy sum of the ballots a tally committee verified.

The light, framework-free core is re-exported here; the protocol is `dphype.protocol`, the Flower adapters are
`dphype.flower` (``register_dphype`` for clients, ``DPHype`` for the server), torch training is
`dphype.ml.training`, the central optimizers are `dphype.central`.
"""

import os as _os

# torch's OpenMP workers busy-wait between parallel regions by default; when several processes
# share the CPUs (parallel Flower clients, benchmarks) that made one Adult client's 100-candidate
# evaluation ~15x slower on a 2-core machine. Set before anything in dphype imports torch; a
# user's own setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from typing import TYPE_CHECKING  # noqa: E402

from dphype._exports import lazy_getattr  # noqa: E402

#: Public name -> the module that defines it, imported on first use (PEP 562): a process that needs only part of
#: dphype does not import scipy, torch and the accountants.
_EXPORTS: dict[str, str] = {
    "DPHypeConfig": "dphype.config",
    "PrivacyReport": "dphype.privacy.accounting",
    "VoteEvent": "dphype.privacy.accounting",
    "calibrate": "dphype.privacy.accounting",
    "epsilon": "dphype.privacy.accounting",
    "privacy_report": "dphype.privacy.accounting",
    "client_noise_std": "dphype.privacy.noise",
    "noise_share": "dphype.privacy.noise",
    "DPHypeResult": "dphype.result",
    "CandidateList": "dphype.selection.candidates",
    "candidate_grid": "dphype.selection.candidates",
    "load_candidates": "dphype.selection.candidates",
    "random_subset": "dphype.selection.candidates",
    "table_iii_grid": "dphype.selection.candidates",
    "select_release": "dphype.selection.rules",
    "raw_score_votes": "dphype.selection.voting",
    "top_k_votes": "dphype.selection.voting",
}

if TYPE_CHECKING:
    from dphype.config import DPHypeConfig
    from dphype.privacy.accounting import PrivacyReport, VoteEvent, calibrate, epsilon, privacy_report
    from dphype.privacy.noise import client_noise_std, noise_share
    from dphype.result import DPHypeResult
    from dphype.selection.candidates import (
        CandidateList,
        candidate_grid,
        load_candidates,
        random_subset,
        table_iii_grid,
    )
    from dphype.selection.rules import select_release
    from dphype.selection.voting import raw_score_votes, top_k_votes


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())


__version__ = "0.1.0"

__all__ = [
    "CandidateList",
    "DPHypeConfig",
    "DPHypeResult",
    "PrivacyReport",
    "VoteEvent",
    "calibrate",
    "candidate_grid",
    "client_noise_std",
    "epsilon",
    "load_candidates",
    "noise_share",
    "privacy_report",
    "random_subset",
    "raw_score_votes",
    "select_release",
    "table_iii_grid",
    "top_k_votes",
]
