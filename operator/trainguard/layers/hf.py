"""`hf://owner/repo[/prefix]` layers: model weights on the Hugging Face Hub, via huggingface_hub.

Weights only (the spec refuses anything else for hf://): the checkpoint's `model*` files. A
safetensors file over the shard limit (5 GB by default, transformers' own default and well
under the Hub's per-file limit) is split into `model-0000k-of-0000n.safetensors` shards plus
`model.safetensors.index.json` (see `shards`), which any Hub reader loads; the remote copy's
manifest lists the shards, hashed with the checkpoint's algorithm.

Commits are batched under the Hub's rate limits: the data files of a checkpoint in commits of
at most `MAX_FILES_PER_COMMIT` files, then one commit with `FINGERPRINTS.json` and the manifest
(a commit is atomic, and it comes only after the data commits verified); pruning is one commit
per removed checkpoint. A 429 or a 5xx answer is retried with backoff, honouring Retry-After.

Verification: after its commit, each file's LFS sha256 (or git blob id, for a small file the
Hub keeps in git) as the Hub reports it must equal the one computed locally; that id is the
file's fingerprint. Resume is the Hub's own: a file whose content is already in the repo's LFS
storage is not sent again. The token is the Secret's `token`; the endpoint is HF_ENDPOINT when
set, else the public Hub. The client uses the Hub's Xet storage where it offers it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    get_session,
    hf_hub_url,
    hf_raise_for_status,
)
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from huggingface_hub.hf_api import RepoFile

# The documented import; the package exports it lazily, which mypy cannot follow.
from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

from trainguard.api.constants import SECRET_KEY_HF_TOKEN
from trainguard.ckpt import (
    MANIFEST_FILENAME,
    SHA256,
    Contents,
    FileEntry,
    Manifest,
    hash_file,
    step_dirname,
)
from trainguard.layers import (
    Credentials,
    LayerConfig,
    LayerError,
    Transfer,
)
from trainguard.layers.base import CHUNK_BYTES, RemoteLayer, Uploads
from trainguard.layers.fingerprints import GIT_BLOB_SHA1, Fingerprint, file_fingerprint
from trainguard.layers.lineage import CheckpointRef, Origin, checkpoint_key, parse_key
from trainguard.layers.shards import SUFFIX, split

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
MAX_FILES_PER_COMMIT = 50
MAX_ATTEMPTS = 5
MAX_BACKOFF_S = 60.0
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
ENDPOINT_ENV = "HF_ENDPOINT"
REVISION = "main"
NOT_FOUND = 404
PARTIAL_CONTENT = 206
# Shards are staged beside L1 under this hidden prefix (no checkpoint reader looks at it).
STAGING_PREFIX = ".upload-"

Operation = CommitOperationAdd | CommitOperationDelete


def git_blob_id(path: Path) -> str:
    """The git blob id the Hub reports for a file kept in git: sha1 of a header + content."""
    return file_fingerprint(path, GIT_BLOB_SHA1)


def hf_api(credentials: Credentials, environ: Mapping[str, str]) -> HfApi:
    """A Hub client with the Secret's token (if any), on HF_ENDPOINT when set."""
    token = credentials.get(SECRET_KEY_HF_TOKEN)
    return HfApi(endpoint=environ.get(ENDPOINT_ENV) or None, token=token)


@contextmanager
def stream_file(
    api: HfApi,
    repo_id: str,
    filename: str,
    *,
    repo_type: str | None = None,
    revision: str = REVISION,
    offset: int = 0,
) -> Iterator[Iterator[bytes]]:
    """Stream one file of a repository from `offset` (the resolve endpoint, redirects followed).

    A server that ignores the range request sends the whole file: its first `offset` bytes are
    skipped here.
    """
    url = hf_hub_url(
        repo_id, filename, repo_type=repo_type, revision=revision, endpoint=api.endpoint
    )
    headers = build_hf_headers(token=api.token)
    if offset:
        headers["Range"] = f"bytes={offset}-"
    with get_session().stream("GET", url, headers=headers, follow_redirects=True) as response:
        hf_raise_for_status(response)
        chunks = response.iter_bytes(CHUNK_BYTES)
        if offset and response.status_code != PARTIAL_CONTENT:
            chunks = _skip(chunks, offset)
        yield chunks


def _skip(chunks: Iterator[bytes], count: int) -> Iterator[bytes]:
    for chunk in chunks:
        if count >= len(chunk):
            count -= len(chunk)
            continue
        yield chunk[count:]
        count = 0


class HfStore:
    """One Hub model repository (and a folder in it), as a `Store`."""

    def __init__(
        self,
        api: HfApi,
        repo_id: str,
        prefix: str,
        max_files_per_commit: int = MAX_FILES_PER_COMMIT,
    ) -> None:
        self.api = api
        self.repo_id = repo_id
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.max_files_per_commit = max_files_per_commit
        self._repo_ready = False

    def _path(self, key: str) -> str:
        return self.prefix + key

    def _commit(self, operations: list[Operation], what: str) -> None:
        """One commit, retried with backoff on rate limiting and server errors."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                self.api.create_commit(
                    self.repo_id,
                    operations=operations,
                    commit_message=f"trainguard: {what}",
                    revision=REVISION,
                )
                return
            except HfHubHTTPError as err:
                status = err.response.status_code if err.response is not None else None
                if status not in RETRY_STATUSES or attempt == MAX_ATTEMPTS:
                    raise
                retry_after = err.response.headers.get("Retry-After", "") if err.response else ""
                delay = float(retry_after) if retry_after.isdigit() else 2.0**attempt
                time.sleep(min(MAX_BACKOFF_S, delay))

    def list_checkpoints(self) -> dict[CheckpointRef, bool]:
        """Checkpoint folders in the repository, and whether their manifest is there."""
        try:
            paths = self.api.list_repo_files(self.repo_id, revision=REVISION)
        except RepositoryNotFoundError:
            return {}
        found: dict[CheckpointRef, bool] = {}
        for path in paths:
            if not path.startswith(self.prefix):
                continue
            parsed = parse_key(path[len(self.prefix) :])
            if parsed is not None:
                ref, name = parsed
                found[ref] = found.get(ref, False) or name == MANIFEST_FILENAME
        return found

    def read(self, key: str) -> bytes | None:
        """A small file in full."""
        try:
            with self.download(key) as chunks:
                return b"".join(chunks)
        except HfHubHTTPError as err:
            if err.response is not None and err.response.status_code == NOT_FOUND:
                return None
            raise

    def upload(self, files: Uploads, transfer: Transfer) -> dict[str, str]:
        """Commit the files in batches, then check each against what the Hub reports."""
        if not self._repo_ready:
            self.api.create_repo(self.repo_id, private=True, exist_ok=True)
            self._repo_ready = True
        operations = {}
        for start in range(0, len(files), self.max_files_per_commit):
            batch = files[start : start + self.max_files_per_commit]
            added = [CommitOperationAdd(self._path(key), str(source)) for source, key in batch]
            self._commit(list(added), f"{len(batch)} files of {batch[0][1].split('/')[0]}")
            for op, (source, key) in zip(added, batch, strict=True):
                operations[key] = (op, source)
                transfer.advance(source.stat().st_size)
        reported = self._infos(list(operations))
        fingerprints = {}
        for key, (op, source) in operations.items():
            info = reported.get(key)
            if info is None:
                raise LayerError(f"{key}: not in the repository after its commit")
            local = op.upload_info.sha256.hex() if info.lfs is not None else git_blob_id(source)
            if _fingerprint(info) != local or info.size != source.stat().st_size:
                raise LayerError(f"{key}: the Hub's copy differs from the local file")
            fingerprints[key] = local
        return fingerprints

    def write_last(self, items: list[tuple[str, bytes]]) -> None:
        """One commit holding every item, the manifest among them (a commit is atomic)."""
        operations = [CommitOperationAdd(self._path(key), data) for key, data in items]
        self._commit(list(operations), f"manifest of {items[-1][0].split('/')[0]}")

    def _infos(self, keys: list[str]) -> dict[str, RepoFile]:
        infos = self.api.get_paths_info(
            self.repo_id, [self._path(key) for key in keys], revision=REVISION
        )
        by_path = {info.path: info for info in infos if isinstance(info, RepoFile)}
        return {key: by_path[self._path(key)] for key in keys if self._path(key) in by_path}

    def stats(self, keys: list[str]) -> dict[str, tuple[int, str] | None]:
        """Size and LFS sha256 (or git blob id) of each file, as the Hub reports them."""
        infos = self._infos(keys)
        return {
            key: (infos[key].size, _fingerprint(infos[key])) if key in infos else None
            for key in keys
        }

    @contextmanager
    def download(self, key: str) -> Iterator[Iterator[bytes]]:
        """Stream one file from the Hub's resolve endpoint (following its redirect)."""
        with stream_file(self.api, self.repo_id, self._path(key)) as chunks:
            yield chunks

    def delete(self, ref: CheckpointRef) -> None:
        """One commit removing the checkpoint's folder (the manifest goes with it, atomically)."""
        folder = CommitOperationDelete(self._path(ref.path) + "/", is_folder=True)
        self._commit([folder], f"remove {ref.path}")


def repo_file_fingerprint(info: RepoFile) -> Fingerprint:
    """What the Hub says a file holds: its LFS sha256, or the git blob id of one kept in git."""
    if info.lfs is not None:
        return Fingerprint(SHA256, info.lfs.sha256)
    return Fingerprint(GIT_BLOB_SHA1, info.blob_id)


def _fingerprint(info: RepoFile) -> str:
    return repo_file_fingerprint(info).value


class HfLayer(RemoteLayer):
    """A weights layer on the Hub: safetensors files over the shard limit go up as shards."""

    def __init__(
        self,
        config: LayerConfig,
        store: HfStore,
        credentials: Credentials,
        max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
        origin: Origin | None = None,
    ) -> None:
        super().__init__(config, store, credentials, origin)
        self.max_shard_bytes = max_shard_bytes

    @contextmanager
    def planned(self, checkpoint: Path, manifest: Manifest) -> Iterator[tuple[Manifest, Uploads]]:
        """The weights, with oversized safetensors files split into shards staged beside L1."""
        with super().planned(checkpoint, manifest) as (weights, files):
            oversized = {
                e.path
                for e in weights.files
                if e.path.endswith(SUFFIX) and e.size > self.max_shard_bytes
            }
            if not oversized:
                yield weights, files
                return
            staging = checkpoint.parent / f"{STAGING_PREFIX}{step_dirname(weights.step)}"
            try:
                entries = [e for e in weights.files if e.path not in oversized]
                uploads = [
                    (src, key) for src, key in files if key.split("/", 3)[3] not in oversized
                ]
                for path in sorted(oversized):
                    for shard in split(checkpoint / path, staging / path, self.max_shard_bytes):
                        relpath = str(Path(path).parent / shard.name).removeprefix("./")
                        size, digest = hash_file(shard, weights.hash_algorithm)
                        entries.append(FileEntry(path=relpath, size=size, hash=digest))
                        ref = CheckpointRef(weights.step, self.origin)
                        uploads.append((shard, checkpoint_key(ref, relpath)))
                yield (
                    weights.model_copy(
                        update={"files": tuple(sorted(entries, key=lambda e: e.path))}
                    ),
                    uploads,
                )
            finally:
                shutil.rmtree(staging, ignore_errors=True)


def open_hf(
    config: LayerConfig,
    credentials: Credentials,
    environ: Mapping[str, str],
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    origin: Origin | None = None,
) -> HfLayer:
    """The layer of an `hf://owner/repo[/prefix]` URI (weights only), shipping for `origin`."""
    if config.contents != Contents.WEIGHTS.value:
        raise LayerError(f"{config.name}: an hf:// layer holds model weights only")
    uri = urlparse(config.uri)
    name, _, prefix = uri.path.lstrip("/").partition("/")
    if not uri.netloc or not name:
        raise LayerError(f"{config.name}: {config.uri} is not hf://owner/repo[/prefix]")
    repo_id = f"{uri.netloc}/{name}"
    api = hf_api(credentials, environ)
    store = HfStore(api, repo_id, prefix)
    return HfLayer(config, store, credentials, max_shard_bytes, origin)
