"""A federation's transport keys: the TLS certificate authority, its certificates and the SuperNode keys.

Three kinds of keys protect a deployment's connections, each made with ``cryptography`` and each separate from
the DP-Hype roster identity (`dphype roster keygen`, an Ed25519 key that the other members verify end to end):

* **TLS** for every Flower connection: a certificate authority (`make_ca`) signs the SuperLink's server
  certificate (`issue`, with the host names and addresses the nodes and ``flwr`` use); every SuperNode and
  ``flwr`` verifies it with the CA certificate (``--root-certificates``). A test federation makes its own CA;
  in production the operators bring certificates of a CA they trust.
* **MPyC TLS** between the tallies: the same CA signs one certificate per tally, with MPyC's expected name
  ``MPyC party J`` and both TLS purposes (each party is a server to the lower indices and a client of the
  higher ones); `issue_mpyc_party` writes the files MPyC's ``--ssl`` reads (``.config/party_J.crt``,
  ``party_J.key``, ``mpyc_ca.crt``). The SuperLink's certificate carries only the server purpose, so it is
  refused as an MPyC client.
* **SuperNode authentication** (Flower's): each SuperNode signs its requests to the SuperLink with an EC P-384
  key (`make_node_key`, OpenSSH format, which ``flower-supernode --auth-supernode-private-key`` reads); the
  SuperLink's operator registers the public half (``flwr supernode register KEY.pub CONNECTION``) and the
  SuperLink (``--enable-supernode-auth``) serves only registered nodes. It says which *connection* may pull
  tasks; the roster identity says which *member* a protocol message comes from, which the SuperLink's operator
  cannot forge.

Private keys are written with mode 0600 and never overwritten.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dphype.secure.tally_party import PARTY_NAME

#: The subject name MPyC's ``--ssl`` expects of party ``J``'s certificate, the one its peers check.
MPYC_NAME = PARTY_NAME
#: Days a test federation's certificates are valid.
VALID_DAYS = 365


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key on disk.

    Attributes:
        cert: The PEM certificate.
        key: The PEM private key (mode 0600).
    """

    cert: Path
    key: Path


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file of mode 0600; an existing file is refused."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP384R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _refuse_existing(*paths: Path) -> None:
    for path in paths:
        if path.exists():
            raise FileExistsError(f"{path} exists: keys are never overwritten; choose another folder or remove it "
                                  "first")


def make_ca(folder: Path, name: str) -> Issued:
    """A new certificate authority ``folder/ca.pem`` and ``folder/ca.key`` named ``name``.

    Args:
        folder: The folder (created if missing).
        name: The CA's common name, e.g. the federation's.

    Returns:
        The CA's certificate and key.

    Raises:
        FileExistsError: If ``ca.pem`` or ``ca.key`` exists there.
    """  # noqa: DOC502
    folder.mkdir(parents=True, exist_ok=True)
    out = Issued(folder / "ca.pem", folder / "ca.key")
    _refuse_existing(out.cert, out.key)
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA384()))
    _write_private(out.key, _pem_key(key))
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return out


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue(ca: Issued, folder: Path, stem: str, *, common_name: str, hosts: tuple[str, ...] = (),
          client: bool = False) -> Issued:
    """A certificate ``folder/STEM.pem`` (and ``STEM.key``) signed by ``ca``, for a TLS server.

    Args:
        ca: The signing CA (`make_ca`).
        folder: The folder (created if missing).
        stem: The files' name without suffix.
        common_name: The subject's common name.
        hosts: Host names and IP addresses it serves (subject alternative names); none: only the common name.
        client: Whether it may also authenticate as a TLS client (MPyC parties are both).

    Returns:
        The certificate and its key.

    Raises:
        FileExistsError: If either file exists.
        ValueError: If ``stem`` or ``common_name`` is empty.
    """  # noqa: DOC503
    if not stem or not common_name:
        raise ValueError("stem and common_name must be non-empty")
    folder.mkdir(parents=True, exist_ok=True)
    out = Issued(folder / f"{stem}.pem", folder / f"{stem}.key")
    _refuse_existing(out.cert, out.key)
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _new_key()
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(min(now + datetime.timedelta(days=VALID_DAYS), ca_cert.not_valid_after_utc))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
    _write_private(out.key, _pem_key(key))
    out.cert.write_bytes(builder.sign(ca_key, hashes.SHA384()).public_bytes(serialization.Encoding.PEM))
    return out


def issue_mpyc_party(ca: Issued, folder: Path, tally_id: int) -> Path:
    """Tally ``tally_id``'s MPyC TLS files in ``folder/.config``, where MPyC's ``--ssl`` reads them.

    ``party_J.crt`` (common name ``MPyC party J``, both TLS purposes), ``party_J.key`` and ``mpyc_ca.crt``
    (``ca``'s certificate).

    Args:
        ca: The signing CA (`make_ca`).
        folder: The folder an MPyC party with ``--ssl`` is started in (created if missing).
        tally_id: The tally's index ``J``, ``>= 0``.

    Returns:
        ``folder``.

    Raises:
        FileExistsError: If the party's files exist there.
        ValueError: If ``tally_id`` is negative.
    """  # noqa: DOC503
    if tally_id < 0:
        raise ValueError(f"tally_id must be >= 0, got {tally_id}")
    config = folder / ".config"
    _refuse_existing(config / f"party_{tally_id}.crt")
    party = issue(ca, config, f"party_{tally_id}", common_name=MPYC_NAME.format(tally_id), client=True)
    party.cert.rename(config / f"party_{tally_id}.crt")
    (config / "mpyc_ca.crt").write_bytes(ca.cert.read_bytes())
    return folder


def make_node_key(path: Path) -> Path:
    """A new SuperNode key: EC P-384 OpenSSH at ``path`` (0600); returns its public half's file, ``<path>.pub``."""
    public = path.with_name(path.name + ".pub")
    _refuse_existing(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = _new_key()
    _write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b"\n")
    return public


def certificate_summary(path: Path) -> str:
    """One line on a PEM certificate: subject, issuer, validity and whether it is valid now."""
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    state = "valid" if cert.not_valid_before_utc <= now <= cert.not_valid_after_utc else "NOT VALID NOW"
    return (f"{path}: {cert.subject.rfc4514_string()}, issued by {cert.issuer.rfc4514_string()}, "
            f"{cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d} ({state})")
