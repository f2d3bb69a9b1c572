"""The checkpoint contract on top of any remote store: what every remote backend shares.

A backend (`Store`) only moves bytes under keys `run-<uid>/attempt-<k>/step-<8 digits>/<path>`
(`trainguard.layers.lineage`: every checkpoint is bound to the attempt that shipped it);
`RemoteLayer` keeps the contract of DESIGN.md "Checkpoints" on top of it:

- put: every file (the weights only, for a weights layer) is uploaded and verified by the
  backend against the server: S3 by per-part MD5 and the multipart ETag, SSH by a sha256
  computed on the remote host, the Hub by the LFS sha256 of the committed file. Then
  `FINGERPRINTS.json` records what the server reported for each file, and `MANIFEST.json` goes
  last: a checkpoint is listed only once its manifest is there.
- verify: the manifest and the fingerprints are there, and every file is there with the
  manifest's size and the fingerprint recorded at upload: what the server can tell without a
  download (on SSH the remote host re-hashes every byte).
- fetch: every file is streamed into an L1 transaction and hashed with the manifest's
  algorithm on the way; one mismatch aborts the fetch (`InvalidCheckpointError`, naming the
  file), so a corrupt copy never lands in L1 and restore falls back to an older checkpoint or
  another layer.
- prune: keep-N over the checkpoints of the run's lineage that verify, so the newest verified
  one is never removed before a newer one has verified; invalid ones (reported), and
  checkpoints outside the lineage (a superseded attempt's late uploads), are left for
  inspection; the manifest goes first, so a half-removed checkpoint is never listed. Abandoned
  partial uploads older than the newest kept checkpoint are removed with it.

Client libraries raise many exception types; `RemoteLayer` turns each into a `LayerError`
whose message passes through `Credentials.redact` and does not chain the original exception
(its arguments could hold a request with credentials in it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from trainguard.ckpt import (
    MANIFEST_FILENAME,
    CheckpointTransaction,
    Contents,
    Manifest,
    Problem,
    verify,
)
from trainguard.layers import (
    Credentials,
    InvalidCheckpointError,
    LayerConfig,
    LayerError,
    NoTransfer,
    Transfer,
    weight_files,
)
from trainguard.layers.lineage import (
    CheckpointRef,
    Lineage,
    Origin,
    Pruning,
    checkpoint_key,
    prune_plan,
)

FINGERPRINTS_FILENAME = "FINGERPRINTS.json"
# A file whose server fingerprint differs from the one recorded at its upload.
CHANGED_ON_LAYER = "changed on the layer since it was uploaded"
# Large enough to keep a network stream busy, small enough to report progress often.
CHUNK_BYTES = 4 * 1024 * 1024

# An error message keeps its causes (a client's wrapper often says little) within a bound.
MAX_CAUSES = 3
MAX_MESSAGE = 1000
# (local file, key on the store) pairs to upload.
Uploads = list[tuple[Path, str]]


def error_chain(err: BaseException) -> str:
    """An exception and its first causes on one line (a client's wrapper often says little).

    Pass the result through `Credentials.redact` before it goes anywhere.
    """
    causes: list[str] = []
    cause: BaseException | None = err
    while cause is not None and len(causes) < MAX_CAUSES:
        causes.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    return " <- ".join(causes)


class Store(Protocol):
    """Bytes under keys `run-<uid>/attempt-<k>/step-<8 digits>/<path>`, relative to the root."""

    def list_checkpoints(self) -> dict[CheckpointRef, bool]:
        """Every checkpoint with something on the store, and whether its manifest is there."""
        ...

    def read(self, key: str) -> bytes | None:
        """A small object in full, or None when it does not exist."""
        ...

    def upload(self, files: Uploads, transfer: Transfer) -> dict[str, str]:
        """Upload (resuming what is there) and verify; return key -> the server's fingerprint."""
        ...

    def write_last(self, items: list[tuple[str, bytes]]) -> None:
        """Write small objects in order, each one whole or not at all, the last one last."""
        ...

    def stats(self, keys: list[str]) -> dict[str, tuple[int, str] | None]:
        """(size, fingerprint) of each key as the server reports it; None where it is missing."""
        ...

    def download(self, key: str) -> AbstractContextManager[Iterator[bytes]]:
        """Stream one object in chunks."""
        ...

    def delete(self, ref: CheckpointRef) -> None:
        """Remove one checkpoint's objects, its manifest first."""
        ...


class RemoteLayer:
    """A checkpoint layer on a `Store` (see the module docstring for the contract).

    `origin` is the attempt whose checkpoints `put` ships (outside a pod: attempt 0).
    """

    def __init__(
        self,
        config: LayerConfig,
        store: Store,
        credentials: Credentials,
        origin: Origin | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.credentials = credentials
        self.origin = origin or Origin.of("", None)
        # Checkpoints this process saw verify: prune need not ask the server about them again.
        self._verified: set[CheckpointRef] = set()

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except InvalidCheckpointError:
            raise  # names the checkpoint's files and what is wrong, never a credential
        except LayerError as err:
            raise LayerError(self.credentials.redact(str(err))) from None
        except Exception as err:  # every client library has its own exception types
            message = f"{self.config.name}: {action}: {error_chain(err)}"
            raise LayerError(self.credentials.redact(message)[:MAX_MESSAGE]) from None

    def checkpoints(self) -> list[CheckpointRef]:
        """Checkpoints whose manifest is on the layer, oldest first."""
        with self._errors("list"):
            found = self.store.list_checkpoints()
            return sorted(ref for ref, complete in found.items() if complete)

    @contextmanager
    def planned(self, checkpoint: Path, manifest: Manifest) -> Iterator[tuple[Manifest, Uploads]]:
        """The manifest and files of the remote copy: all files, or the weights only."""
        entries = manifest.files
        if self.config.contents == Contents.WEIGHTS.value:
            chosen = set(weight_files(manifest.files))
            entries = tuple(e for e in manifest.files if e.path in chosen)
            manifest = manifest.model_copy(update={"files": entries, "contents": Contents.WEIGHTS})
        ref = CheckpointRef(manifest.step, self.origin)
        yield manifest, [(checkpoint / e.path, checkpoint_key(ref, e.path)) for e in entries]

    def put(self, checkpoint: Path, transfer: Transfer | None = None) -> CheckpointRef:
        """Upload a verified local checkpoint; the manifest last, once every file verified."""
        transfer = transfer or NoTransfer()
        local = verify(checkpoint, check_hashes=False)
        if local.manifest is None or not local.ok:
            raise LayerError(f"{self.config.name}: {checkpoint} does not verify: {local.reasons}")
        step = local.manifest.step
        ref = CheckpointRef(step, self.origin)
        with self._errors(f"put of step {step}"):
            if self.store.list_checkpoints().get(ref):
                # Shipped before (an earlier try of this attempt): it counts only if it verifies.
                problems = self.verify(ref)
                if problems:
                    raise InvalidCheckpointError(self.config.name, step, tuple(problems))
                transfer.begin(0)
                return ref
            with self.planned(checkpoint, local.manifest) as (manifest, files):
                transfer.begin(sum(source.stat().st_size for source, _ in files))
                fingerprints = self.store.upload(files, transfer)
                manifest_bytes = manifest.to_json_bytes()
                self.store.write_last(
                    [
                        (checkpoint_key(ref, FINGERPRINTS_FILENAME), _json_bytes(fingerprints)),
                        (checkpoint_key(ref, MANIFEST_FILENAME), manifest_bytes),
                    ]
                )
            # Every file was verified by its upload; the manifest must read back as written.
            if self.store.read(checkpoint_key(ref, MANIFEST_FILENAME)) != manifest_bytes:
                wrong = Problem(MANIFEST_FILENAME, "did not read back as written")
                raise InvalidCheckpointError(self.config.name, step, (wrong,))
        self._verified.add(ref)
        return ref

    def _manifest(self, ref: CheckpointRef) -> tuple[Manifest | None, list[Problem]]:
        step = ref.step
        raw = self.store.read(checkpoint_key(ref, MANIFEST_FILENAME))
        if raw is None:
            return None, [Problem(None, f"missing {MANIFEST_FILENAME}")]
        try:
            manifest = Manifest.from_json_bytes(raw)
        except ValidationError as err:
            return None, [Problem(None, f"malformed {MANIFEST_FILENAME}: {err.errors()[0]['msg']}")]
        if manifest.step != step:
            return None, [
                Problem(None, f"{MANIFEST_FILENAME} says step {manifest.step}, not {step}")
            ]
        return manifest, []

    def verify(self, ref: CheckpointRef) -> list[Problem]:
        """Problems of the remote copy that the server can tell without a download."""
        with self._errors(f"verify of {ref}"):
            manifest, problems = self._manifest(ref)
            if manifest is None:
                return problems
            raw = self.store.read(checkpoint_key(ref, FINGERPRINTS_FILENAME))
            recorded: dict[str, str] = json.loads(raw) if raw is not None else {}
            if raw is None:
                problems.append(Problem(None, f"missing {FINGERPRINTS_FILENAME}"))
            keys = {entry.path: checkpoint_key(ref, entry.path) for entry in manifest.files}
            stats = self.store.stats(list(keys.values()))
            for entry in manifest.files:
                stat = stats.get(keys[entry.path])
                if stat is None:
                    problems.append(Problem(entry.path, "missing"))
                elif stat[0] != entry.size:
                    size = f"size {stat[0]} != {entry.size} in the manifest"
                    problems.append(Problem(entry.path, size))
                elif raw is not None and recorded.get(keys[entry.path]) != stat[1]:
                    problems.append(Problem(entry.path, CHANGED_ON_LAYER))
        if not problems:
            self._verified.add(ref)
        return problems

    def fetch(self, ref: CheckpointRef, dest_root: Path) -> Path:
        """Stream one checkpoint into `dest_root`, hashing every byte against the manifest."""
        step = ref.step
        with self._errors(f"fetch of {ref}"):
            manifest, problems = self._manifest(ref)
            if manifest is None:
                raise InvalidCheckpointError(self.config.name, step, tuple(problems))
            with CheckpointTransaction(
                dest_root,
                step,
                contents=manifest.contents,
                algorithm=manifest.hash_algorithm,
                metadata=manifest.metadata,
                world_size=manifest.world_size,
            ) as txn:
                for entry in manifest.files:
                    writer = txn.create_as(entry)
                    try:
                        with self.store.download(checkpoint_key(ref, entry.path)) as chunks:
                            for chunk in chunks:
                                writer.write(chunk)
                    except BaseException:
                        writer.discard()
                        raise
                    got = writer.close()
                    if (got.size, got.hash) != (entry.size, entry.hash):
                        what = f"{manifest.hash_algorithm} hash or size differs from the manifest"
                        wrong = Problem(entry.path, what)
                        raise InvalidCheckpointError(self.config.name, step, (wrong,))
                txn.report_copied_shards()
                return Path(txn.commit(timestamp=manifest.time).path)

    def prune(self, keep: int, lineage: Lineage | None = None) -> Pruning:
        """Keep-N over the lineage's checkpoints (`lineage.prune_plan`).

        Returns those deleted and the invalid ones kept. Without a lineage: this layer's origin
        with no fences (outside a pod).
        """
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        lineage = lineage or Lineage(self.origin)
        with self._errors("prune"):
            found = self.store.list_checkpoints()
            plan = prune_plan(
                found,
                keep,
                lineage,
                # What the server can tell is cheap: every candidate gets the same check.
                lambda ref, _deep: [] if ref in self._verified else self.verify(ref),
            )
            for ref in plan.deleted:
                self.store.delete(ref)
                self._verified.discard(ref)
            return Pruning(sorted(ref for ref in plan.deleted if found[ref]), plan.invalid)


def _json_bytes(value: dict[str, str]) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()
