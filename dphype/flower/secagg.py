"""Deprecated path: DP-Hype's SecAgg+ adapter is split by side, :mod:`dphype.flower.server.secagg` (the server's
round) and :mod:`dphype.flower.client.secagg` (a node's answers), with its message type and keys in
:mod:`dphype.flower.wire`. The names below still work from here, with a ``DeprecationWarning``, for one release."""

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
