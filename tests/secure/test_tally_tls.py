"""The tallies' MPyC parties over MPyC's TLS (``--ssl``): each peer's certificate must be its own party's; a
certificate the committee's CA issued to another party is refused and nothing is opened."""

from __future__ import annotations

import os
import ssl
import subprocess
import time
from types import SimpleNamespace

import numpy as np
import pytest

from dphype.node.pki import MPYC_NAME, issue, issue_mpyc_party, make_ca
from dphype.secure.committee import (
    Opening,
    Tally,
    TallyError,
    client_sealed_shares,
    loopback_addresses,
    party_command,
    party_result,
    send_job,
    voter_id,
)
from dphype.secure.tally_party import PARTY_NAME, wrong_parties
from dphype.selection.ballots import BallotForm


def _jobs(request: str) -> list[dict]:
    """Three tallies' jobs for 3 ballots over 4 candidates whose counts are 1 3 0 2 (argmax: candidate 1)."""
    tallies = [Tally(j) for j in range(3)]
    for t in tallies:
        t.open_round(request, 4, 2, form=BallotForm.top_k(2), noise=np.zeros(4, dtype=np.int64))
    keys = [t.public for t in tallies]
    for c, ones in enumerate([(0, 1), (1, 3), (1, 3)]):
        vec = np.zeros(4, dtype=np.int64)
        vec[list(ones)] = 1
        for t, share in zip(tallies, client_sealed_shares(request, vec, keys, voter_id(0, f"c{c}")), strict=True):
            t.receive(f"c{c}", share)
    return [t.job() for t in tallies]


def _run(folders, request, timeouts=(30.0, 30.0, 30.0)):
    """Each party in its folder with --ssl; every party's opening or its refusal. The parties are waited for in
    the order of their ``timeouts``, longest first, each for its own timeout."""
    addresses = loopback_addresses(3)
    procs = [subprocess.Popen(party_command(j, addresses, ssl=True), cwd=folder, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for j, folder in enumerate(folders)]
    for proc, job in zip(procs, _jobs(request), strict=True):
        send_job(proc, job, deadline=60, anchor=os.getpid())
    out: list = [None] * len(procs)
    try:
        for j in sorted(range(len(procs)), key=lambda j: -timeouts[j]):
            try:
                out[j] = party_result(procs[j], j, time.monotonic() + timeouts[j], timeouts[j])[0]
            except TallyError as err:
                out[j] = str(err)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mpyc-pki")
    return folder, make_ca(folder, "committee CA")


def test_the_party_name_is_the_one_the_certificates_carry():
    assert PARTY_NAME == MPYC_NAME


def test_parties_with_their_own_certificates_open_the_argmax(ca):
    folder, authority = ca
    folders = [issue_mpyc_party(authority, folder / f"honest-{j}", j) for j in range(3)]
    assert _run(folders, "req-tls-1") == [Opening(1, ())] * 3


def test_a_valid_certificate_of_another_party_is_refused_and_nothing_is_opened(ca):
    folder, authority = ca
    folders = [issue_mpyc_party(authority, folder / f"pinned-{j}", j) for j in (1, 2)]
    # party 0's operator holds a certificate the committee's CA issued to party 1 and connects as party 0
    impostor = folder / "impostor" / ".config"
    issued = issue(authority, impostor, "party_0", common_name=MPYC_NAME.format(1), client=True)
    issued.cert.rename(impostor / "party_0.crt")
    (impostor / "mpyc_ca.crt").write_bytes(authority.cert.read_bytes())
    # the impostor, refused by both peers, keeps trying to reach them until it is stopped: it is waited for
    # last, 3 s after the peers answered
    out = _run([folder / "impostor", *folders], "req-tls-2", timeouts=(3.0, 30.0, 30.0))
    assert not any(isinstance(o, Opening) for o in out)  # nothing opened anywhere
    # the parties it reached refuse; the first to check names its certificate (one that checks after another
    # refused finds that party's connection gone)
    assert all(f"tally {j} refused to open: the parties' certificates do not check out" in out[j] for j in (1, 2))
    assert any("party 0 presented MPyC party 1)" in out[j] or "party 0 presented MPyC party 1;" in out[j]
               for j in (1, 2))


def test_a_certificate_whose_other_names_claim_another_party_is_refused_by_the_pin(ca):
    """TLS matches a host name against a certificate's DNS names before its common name: a certificate of the
    committee's CA with the right common name and another party's DNS name could speak for that party, so the pin
    (`wrong_parties`) reads both. White-box: the certificate as Python's ``ssl`` decodes a verified peer's."""
    folder, authority = ca
    decode = ssl._ssl._test_decode_cert  # what getpeercert() returns for this certificate
    mixed = issue(authority, folder / "mixed", "party_1", common_name=MPYC_NAME.format(1),
                  hosts=(MPYC_NAME.format(2),), client=True)
    own = issue_mpyc_party(authority, folder / "own-1", 1) / ".config" / "party_1.crt"

    def peers(cert_file):
        info = decode(str(cert_file))
        transport = SimpleNamespace(get_extra_info=lambda key: info if key == "peercert" else None)
        return [SimpleNamespace(pid=0, protocol=None), SimpleNamespace(pid=1, protocol=SimpleNamespace(
            transport=transport))]

    assert wrong_parties(peers(own), 0) == []
    assert wrong_parties(peers(mixed.cert), 0) == [f"party 1 presented {MPYC_NAME.format(1)}, {MPYC_NAME.format(2)}"]
