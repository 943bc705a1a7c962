"""DP-Hype's wire vocabulary on Flower's Message API, each name defined once.

Every action, message type, record key and context-state key is here; every sender and every receiver imports it
from here.

Style: a DP-Hype name is lowercase words joined by ``_`` and starts with ``dphype`` (``dphype_committee``,
``dphype_secagg_state``): an action must be a Python identifier (Flower checks it), and the record and state keys
follow the same style. A message type is Flower's own ``<category>.<action>`` (``query.dphype``). The node-config
keys an operator types (``dphype-max-epsilon``, ``dphype-tally-id``, ...) are not wire names: they keep Flower's
node-config style (dashes), in `dphype.node.policy` and `dphype.flower.tally_node`.

Glossary (one name per concept, in the package's names, messages and errors): the **committee** is the path of
the committee releases (``release="argmax"`` and ``"committee-sum"``, `dphype.release.Aggregator.COMMITTEE`):
clients seal Shamir shares of their ballots to it, it checks them under MPC and opens only the release; a
**tally** is one member of the committee (a role, like a **voter**: a tally node, its key, its MPyC party, its
stages); **argmax** names only the release ``"argmax"`` and what its committee opens (the sum release's rule that
releases the most noisy votes is ``"max-votes"``).

The values are compatible within one release of DP-Hype (a deployment runs one version on every node).

| name | value | what |
|---|---|---|
| `ACTION` | ``dphype`` | pre-flight (``query``) and secure vote (``train``) |
| `COMMITTEE_ACTION` | ``dphype_committee`` | a client's sealed shares (``train``) |
| `TALLY_ACTION` | ``dphype_tally`` | the tally stages (``query``) |
| `EVALUATION_ACTION` | ``dphype_evaluation`` | the private evaluation's pre-flight (``query``) and stages (``train``) |
| `PREFLIGHT_TYPE` | ``query.dphype`` | message type of the pre-flight |
| `VOTE_TYPE` | ``train.dphype`` | message type of the secure vote's stages |
| `COMMITTEE_VOTE_TYPE` | ``train.dphype_committee`` | message type of the committee vote |
| `TALLY_TYPE` | ``query.dphype_tally`` | message type of the tally stages |
| `EVALUATION_PREFLIGHT_TYPE` | ``query.dphype_evaluation`` | the evaluation's request, the model and its first stage |
| `EVALUATION_TYPE` | ``train.dphype_evaluation`` | message type of the evaluation's SecAgg+ stages |
| `MODEL_KEY` | ``dphype_model`` | record (arrays): the final model the clients evaluate |
| `EVALUATION_STATE` | ``dphype_evaluation_state`` | state: the approved evaluation request, its guarantee, the values |
| `RECORD_KEY` | ``dphype`` | record: the request, the pre-flight answer, the sealed shares |
| `STAGE_KEY` | ``dphype_secagg`` | record: a SecAgg+ stage and its answer |
| `TALLY_KEY` | ``dphype_tally`` | record: a tally stage and its answer |
| `CANDIDATE_KEY` | ``dphype_candidate`` | train-config entry: the selected candidate (JSON) |
| `APPROVAL_STATE` | ``dphype_approval`` | state: the approved request's digest, direction, n, xi, roster digest |
| `REQUEST_STATE` | ``dphype_request`` | state: the approved request's record |
| `GUARANTEE_STATE` | ``dphype_guarantee`` | state: its guarantee and the policy it was computed under |
| `SCORES_STATE` | ``dphype_scores`` | state (array record): the node's scores until it votes |
| `SECAGG_STATE` | ``dphype_secagg_state`` | state: the node's SecAgg+ round |
| `TALLY_STATE` | ``dphype_tally_state`` | state: a tally node's job and party (its served requests: beside its key) |

The tally stages (the ``stage`` entry of a `TALLY_KEY` record) are `TALLY_STAGES`; the SecAgg+
stages are the protocol's own (`dphype.secure.secagg.STAGES`).
"""

from __future__ import annotations

from flwr.app import MessageType

#: Action of the pre-flight (``query``) and of the secure vote (``train``).
ACTION = "dphype"
#: Action of a client's sealed shares in argmax mode (``train``).
COMMITTEE_ACTION = "dphype_committee"
#: Action of the tally nodes' stages (``query``).
TALLY_ACTION = "dphype_tally"
#: Action of the private evaluation of the final model: its pre-flight (``query``) and SecAgg+ stages (``train``).
EVALUATION_ACTION = "dphype_evaluation"

#: Message type of the pre-flight.
PREFLIGHT_TYPE = f"{MessageType.QUERY}.{ACTION}"
#: Message type of the secure vote's SecAgg+ stages.
VOTE_TYPE = f"{MessageType.TRAIN}.{ACTION}"
#: Message type of the committee vote (sealed shares to the tally committee).
COMMITTEE_VOTE_TYPE = f"{MessageType.TRAIN}.{COMMITTEE_ACTION}"
#: Message type of the tally stages.
TALLY_TYPE = f"{MessageType.QUERY}.{TALLY_ACTION}"
#: Message type of the private evaluation's pre-flight (its request, the model and the first SecAgg+ stage).
EVALUATION_PREFLIGHT_TYPE = f"{MessageType.QUERY}.{EVALUATION_ACTION}"
#: Message type of the private evaluation's SecAgg+ stages.
EVALUATION_TYPE = f"{MessageType.TRAIN}.{EVALUATION_ACTION}"

#: Record key of the request in DP-Hype's messages, of the answer in pre-flight replies and of the sealed shares
#: in argmax-vote replies.
RECORD_KEY = "dphype"
#: Record key of a SecAgg+ stage's content in a message and in its reply (the first stage rides on the pre-flight).
STAGE_KEY = "dphype_secagg"
#: Record key of a tally stage's content and of its answer.
TALLY_KEY = "dphype_tally"
#: Train-config key that carries the selected candidate (its hyperparameters as one JSON object).
CANDIDATE_KEY = "dphype_candidate"
#: Record key (an array record) of the final model in the private evaluation's pre-flight.
MODEL_KEY = "dphype_model"

#: Context-state key of the request a node approved in its pre-flight: digest, direction, clients, dropout, and the
#: digest of the node's roster then (empty without one).
APPROVAL_STATE = "dphype_approval"
#: Context-state key of the approved request itself (its record, `dphype.protocol.VoteRequest.to_record`).
REQUEST_STATE = "dphype_request"
#: Context-state key of the approved request's guarantee (`dphype.node.policy.VoteGuarantee`) and of the
#: policy it was computed under.
GUARANTEE_STATE = "dphype_guarantee"
#: Context-state key (an array record) of the node's local scores between pre-flight and vote.
SCORES_STATE = "dphype_scores"
#: Context-state key of the node's SecAgg+ round (`dphype.secure.secagg.NodeRound`).
SECAGG_STATE = "dphype_secagg_state"
#: Context-state key of a tally node's state (`dphype.flower.tally_node.TallyNode`).
TALLY_STATE = "dphype_tally_state"
#: Context-state key of the private evaluation a node approved: the request's record, its guarantee and the policy
#: it was computed under, the node's two values on the grid (until they are sent) and the roster digest.
EVALUATION_STATE = "dphype_evaluation_state"

#: Longest wait, in seconds, a server may ask of a tally's ``result`` stage (one day).
MAX_RESULT_WAIT = 86400.0
#: Default wait, in seconds, for every tally's MPyC party to check the ballots and open the result (``result``).
TALLY_TIMEOUT = 60.0

#: The tally stages, in order: ``hello`` (index and public key), ``collect`` (the sealed shares), ``compute``
#: (start the MPyC party), ``result`` (what it opened: the index or the noisy sum, and who cast invalid ballots).
TALLY_HELLO, TALLY_COLLECT, TALLY_COMPUTE, TALLY_RESULT = TALLY_STAGES = ("hello", "collect", "compute", "result")
