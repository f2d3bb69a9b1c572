"""PKI for the local control plane: one CA, a serving/client certificate, a service-account key.

Uses the `openssl` command line so that the operator's runtime needs no crypto library.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

# Names the serving certificate answers to: the loopback address the apiserver binds
# and the in-cluster service names that clients inside pods would use.
SERVING_NAMES = (
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
    "IP:127.0.0.1",
    "IP:10.96.0.1",
)
DAYS = "3650"


@dataclass(frozen=True)
class Pki:
    """Paths of the cluster's key material."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        """The CA certificate."""
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        """The CA private key."""
        return self.root / "ca.key"

    @property
    def cert(self) -> Path:
        """Serving certificate of the apiserver, also the admin client certificate."""
        return self.root / "admin.crt"

    @property
    def key(self) -> Path:
        """Private key of the serving/client certificate."""
        return self.root / "admin.key"

    @property
    def sa_key(self) -> Path:
        """Service-account token signing key."""
        return self.root / "sa.key"

    @property
    def sa_pub(self) -> Path:
        """Service-account token verification key."""
        return self.root / "sa.pub"

    def exists(self) -> bool:
        """True when every file has been generated."""
        files = (self.ca_cert, self.ca_key, self.cert, self.key, self.sa_key, self.sa_pub)
        return all(p.exists() for p in files)

    def generate(self) -> None:
        """Create the CA, the serving+client certificate (group system:masters) and SA keys."""
        self.root.mkdir(parents=True, exist_ok=True)
        _openssl("genrsa", "-out", self.ca_key, "2048")
        _openssl(
            "req", "-x509", "-new", "-key", self.ca_key, "-days", DAYS,
            "-subj", "/CN=trainguard-dev-ca", "-out", self.ca_cert,
        )  # fmt: skip
        _openssl("genrsa", "-out", self.key, "2048")
        csr = self.root / "admin.csr"
        # O=system:masters makes the client a cluster administrator under RBAC.
        _openssl(
            "req", "-new", "-key", self.key, "-subj", "/O=system:masters/CN=trainguard-admin",
            "-out", csr,
        )  # fmt: skip
        ext = self.root / "admin.ext"
        ext.write_text(
            "basicConstraints=CA:FALSE\n"
            "keyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            f"subjectAltName={','.join(SERVING_NAMES)}\n"
        )
        _openssl(
            "x509", "-req", "-in", csr, "-CA", self.ca_cert, "-CAkey", self.ca_key,
            "-CAcreateserial", "-days", DAYS, "-extfile", ext, "-out", self.cert,
        )  # fmt: skip
        _openssl("genrsa", "-out", self.sa_key, "2048")
        _openssl("rsa", "-in", self.sa_key, "-pubout", "-out", self.sa_pub)

    def issue(self, stem: Path, subject: str, names: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """Sign a client+serving certificate for `subject` (e.g. ``/O=grp/CN=user``).

        Writes ``<stem>.crt`` and ``<stem>.key``; `names` are subjectAltName entries
        (``IP:...``, ``DNS:...``). Returns (certificate, key); an existing pair is kept.
        """
        cert, key = stem.with_suffix(".crt"), stem.with_suffix(".key")
        if cert.exists() and key.exists():
            return cert, key
        stem.parent.mkdir(parents=True, exist_ok=True)
        _openssl("genrsa", "-out", key, "2048")
        csr, ext = stem.with_suffix(".csr"), stem.with_suffix(".ext")
        _openssl("req", "-new", "-key", key, "-subj", subject, "-out", csr)
        lines = [
            "basicConstraints=CA:FALSE",
            "keyUsage=digitalSignature,keyEncipherment",
            "extendedKeyUsage=serverAuth,clientAuth",
        ]
        if names:
            lines.append(f"subjectAltName={','.join(names)}")
        ext.write_text("\n".join(lines) + "\n")
        _openssl(
            "x509", "-req", "-in", csr, "-CA", self.ca_cert, "-CAkey", self.ca_key,
            "-CAcreateserial", "-days", DAYS, "-extfile", ext, "-out", cert,
        )  # fmt: skip
        return cert, key


def _openssl(*args: str | Path) -> None:
    result = subprocess.run(
        ["openssl", *map(str, args)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")
