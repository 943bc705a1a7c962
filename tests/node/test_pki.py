"""A federation's transport keys (dphype.node.pki): the CA, the SuperLink's and tallies' certificates, node keys."""

from __future__ import annotations

import socket
import ssl
import stat
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from dphype.node.pki import certificate_summary, issue, issue_mpyc_party, make_ca, make_node_key


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca = make_ca(folder, "test federation CA")
    link = issue(ca, folder, "superlink", common_name="127.0.0.1", hosts=("127.0.0.1", "link.example"))
    for j in range(2):
        issue_mpyc_party(ca, folder / f"tally-{j}", j)
    return folder, ca, link


def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, name: str) -> str | None:
    """A TLS handshake over a socket pair; ``None`` if both sides accept, else every failing side's error (the side
    that refuses first and the one that hears its alert fail in either order)."""
    left, right = socket.socketpair()
    errors: list[str] = []

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(left, server_side=True) as conn:
                conn.recv(1)
        except (ssl.SSLError, OSError) as exc:
            errors.append(f"server: {exc}")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(right, server_hostname=name) as conn:
            conn.sendall(b"x")
            conn.recv(1)  # the server's verdict on our certificate arrives after the handshake in TLS 1.3
    except (ssl.SSLError, OSError) as exc:
        errors.append(f"client: {exc}")
    finally:
        right.close()
        thread.join(5)
    return "; ".join(sorted(errors)) if errors else None


def _mpyc_contexts(folder, j: int, ca) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """MPyC's two contexts for party ``j`` (mpyc.runtime with --ssl): listening and connecting."""
    crt, key = folder / f"tally-{j}/.config/party_{j}.crt", folder / f"tally-{j}/.config/party_{j}.key"
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(crt, key)
    server.load_verify_locations(cafile=ca)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    client.load_cert_chain(crt, key)
    client.load_verify_locations(cafile=ca)
    return server, client


def test_the_superlink_certificate_verifies_for_its_hosts(federation):
    folder, ca, link = federation
    cert = x509.load_pem_x509_certificate(link.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["link.example"]
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(link.cert, link.key)
    client = ssl.create_default_context(cafile=ca.cert)  # what a SuperNode's --root-certificates does
    assert _handshake(server, client, "link.example") is None
    assert "mismatch" in str(_handshake(server, client, "other.example"))
    for key in (ca.key, link.key, folder / "tally-0/.config/party_0.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert "(valid)" in certificate_summary(link.cert) and "test federation CA" in certificate_summary(link.cert)


def test_mpyc_parties_authenticate_each_other_and_nothing_else(federation):
    folder, ca, link = federation
    listen1, _ = _mpyc_contexts(folder, 1, ca.cert)
    _, connect0 = _mpyc_contexts(folder, 0, ca.cert)
    assert _handshake(listen1, connect0, "MPyC party 1") is None  # party 0 connects to party 1, as MPyC does
    listen0, _ = _mpyc_contexts(folder, 0, ca.cert)
    assert "mismatch" in str(_handshake(listen0, connect0, "MPyC party 1"))  # party 0's certificate is not 1's
    # the SuperLink's certificate (server purpose only) is refused as an MPyC client, and no certificate at all too
    intruder = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca.cert)
    intruder.load_cert_chain(link.cert, link.key)
    assert "server:" in str(_handshake(listen1, intruder, "MPyC party 1"))
    anonymous = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca.cert)
    assert _handshake(listen1, anonymous, "MPyC party 1") is not None


def test_keys_are_never_overwritten(federation):
    folder, ca, _ = federation
    with pytest.raises(FileExistsError, match="never overwritten"):
        make_ca(folder, "another")
    with pytest.raises(FileExistsError, match="never overwritten"):
        issue_mpyc_party(ca, folder / "tally-0", 0)
    with pytest.raises(ValueError, match="tally_id must be >= 0"):
        issue_mpyc_party(ca, folder / "tally-x", -1)


def test_node_keys_are_what_flower_reads(tmp_path):
    public = make_node_key(tmp_path / "node.key")
    key = load_ssh_private_key((tmp_path / "node.key").read_bytes(), None)  # as flower-supernode loads it
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert public.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert load_ssh_public_key(public.read_bytes()) == key.public_key()
    assert stat.S_IMODE((tmp_path / "node.key").stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        make_node_key(tmp_path / "node.key")


def test_every_issued_leaf_certificate_is_not_a_ca_so_no_member_can_mint_certificates_for_others(federation):
    """Only the federation's CA signs certificates: a leaf that were a CA (the SuperLink's, a tally's MPyC party's)
    could issue a certificate naming another party, which every peer would accept."""
    folder, ca, link = federation
    constraints = {path: x509.load_pem_x509_certificate(path.read_bytes()).extensions.get_extension_for_class(
        x509.BasicConstraints) for path in (ca.cert, link.cert, folder / "tally-0/.config/party_0.crt")}
    assert all(c.critical for c in constraints.values())
    assert [c.value.ca for c in constraints.values()] == [True, False, False]
