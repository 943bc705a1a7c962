"""Vote requests as an honest (or a lying) server builds them, for the client-guard tests; a permissive node
policy for tests of small, large-budget federations."""

from __future__ import annotations

from dphype.config import DPHypeConfig
from dphype.protocol import VoteRequest, make_vote_request
from dphype.selection.candidates import CandidateList, table_iii_grid

#: Node-config keys of a policy that admits the small, large-budget federations of the protocol tests (the
#: defaults ask for at least 10 clients, 4 neighbours and epsilon <= 1): what their nodes' operators set.
PERMISSIVE = {"dphype-max-epsilon": 1000.0, "dphype-min-clients": 2, "dphype-min-neighbours": 1,
              "dphype-lifetime-epsilon": 1e6}


def make_request(
    epsilon: float = 1.0,
    delta: float = 1e-5,
    k: int = 5,
    clients: int = 50,
    dropout: float = 0.0,
    noise: str = "skellam",
    accountant: str | None = None,
    sigma: float | None = None,
    candidates: CandidateList | None = None,
) -> VoteRequest:
    """The request a server sends: sigma calibrated for the announced budget, unless a lying server gives ``sigma``."""
    config = DPHypeConfig(epsilon, delta, k, clients, dropout, noise, accountant)
    candidates = table_iii_grid() if candidates is None else candidates
    return make_vote_request(config, candidates) if sigma is None else VoteRequest(candidates, config, sigma)
