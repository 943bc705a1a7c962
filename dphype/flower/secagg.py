"""Deprecated path of DP-Hype's SecAgg+ adapter, which is now split by side.

The server's round is in `dphype.flower.server.secagg`, a node's answers in `dphype.flower.client.secagg`, the
message type and keys in `dphype.flower.wire` (``check_timeout`` in `dphype.flower.grid`). The old names still
work from here, with a ``DeprecationWarning``, for one release.
"""

from dphype._exports import moved_getattr

__getattr__ = moved_getattr(__name__, {
    **{name: "dphype.flower.server.secagg" for name in ("SecureSum", "advertise_record", "run_secure_sum",
                                                          "secagg_graph")},
    **{name: "dphype.flower.client.secagg" for name in ("abort_round", "round_in_progress", "secure_vote_reply",
                                                          "stage_reply")},
    "check_timeout": "dphype.flower.grid",
    "VOTE_MESSAGE_TYPE": "dphype.flower.wire:VOTE_TYPE",
    "RECORD_KEY": "dphype.flower.wire:STAGE_KEY",
    "STATE_KEY": "dphype.flower.wire:SECAGG_STATE",
})
