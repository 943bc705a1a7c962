"""Release modes: what the server learns from the clients' ballots, one module per mode behind one interface.

`dphype.release.base` holds the interface (`ReleaseMode`), its registry (`RELEASE_MODES`, `release_mode`) and
`Aggregator`; each mode lives in its own module and registers itself by setting ``name``: `SumRelease` (``"sum"``,
the paper's: the noisy vote sum over SecAgg+, picked by the selection rule), `ArgmaxRelease` (``"argmax"``: only the
winner's index, a secure argmax among tally parties) and `CommitteeSumRelease` (``"committee-sum"``: the noisy vote
sum of the ballots a tally committee verified). A new mode is one module here plus its import below
(docs/releases.md, "Adding a release mode").
"""

from dphype.release.base import (
    RELEASE_MODES,
    SIGMA_SLACK,
    Aggregator,
    NodeCost,
    ReleaseConfig,
    ReleaseMode,
    ReleaseRequest,
    committee_releases,
    release_mode,
    release_modes,
    vote_cost,
    vote_event,
)
from dphype.release.committee_mode import CommitteeMode

# each import registers its mode; their order is the registry's, the planner's order among tied modes
# isort: split
from dphype.release.sum import SumRelease

# isort: split
from dphype.release.argmax import DEFAULT_ARGMAX_BALLOT, ArgmaxRelease

# isort: split
from dphype.release.committee_sum import CommitteeSumRelease

__all__ = [
    "DEFAULT_ARGMAX_BALLOT",
    "RELEASE_MODES",
    "SIGMA_SLACK",
    "Aggregator",
    "ArgmaxRelease",
    "CommitteeMode",
    "CommitteeSumRelease",
    "NodeCost",
    "ReleaseConfig",
    "ReleaseMode",
    "ReleaseRequest",
    "SumRelease",
    "committee_releases",
    "release_mode",
    "release_modes",
    "vote_cost",
    "vote_event",
]
