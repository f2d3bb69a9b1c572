"""`s3://bucket/prefix` layers on any S3-compatible server, through boto3.

Every file goes up as a multipart upload (one part for a small file), each part with its
Content-MD5 so the server rejects a part that arrived damaged, and each part's returned ETag
checked against the local MD5. The object's ETag after completion must be the multipart ETag
computed locally (MD5 of the parts' MD5s, `-<parts>`); that ETag is the file's fingerprint.

Resume: an interrupted upload (a dropped connection, a server restart) leaves its multipart
upload open on the server. The next put finds it (ListMultipartUploads), lists its parts, and
sends only the parts that are missing or differ; an object already complete with the expected
ETag is not sent again.

Where: the bucket must exist. The endpoint is the Secret's AWS_ENDPOINT_URL, else the
AWS_ENDPOINT_URL variable, else AWS; the keys are the Secret's, else boto3's default chain (the
pod's identity). Checksums beyond Content-MD5 are not requested, so servers that lack the newer
flexible checksums work too.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from trainguard.api.constants import (
    SECRET_KEY_S3_ACCESS_KEY_ID,
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
)
from trainguard.ckpt import MANIFEST_FILENAME
from trainguard.layers import Credentials, LayerConfig, LayerError, Transfer
from trainguard.layers.base import CHUNK_BYTES, RemoteLayer, Uploads
from trainguard.layers.fingerprints import S3_MULTIPART, file_fingerprint, multipart_etag
from trainguard.layers.lineage import CheckpointRef, Origin, parse_key

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MIB = 2**20
# S3's bounds on multipart uploads: parts of at least 5 MiB (but the last), at most 10000.
MIN_PART_BYTES = 5 * MIB
MAX_PARTS = 10_000
DEFAULT_PART_BYTES = 64 * MIB
DEFAULT_REGION = "us-east-1"
ENDPOINT_ENV = "AWS_ENDPOINT_URL"
REGION_ENVS = ("AWS_REGION", "AWS_DEFAULT_REGION")
NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})
DELETE_BATCH = 1000


def _etag(response: Mapping[str, Any]) -> str:
    return str(response["ETag"]).strip('"')


def _md5_b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


class S3Store:
    """One bucket and key prefix, as a `Store`."""

    def __init__(
        self, client: S3Client, bucket: str, prefix: str, part_bytes: int = DEFAULT_PART_BYTES
    ) -> None:
        if part_bytes < MIN_PART_BYTES:
            raise ValueError(f"part_bytes must be at least {MIN_PART_BYTES}")
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.part_bytes = part_bytes

    def _key(self, key: str) -> str:
        return self.prefix + key

    def list_checkpoints(self) -> dict[CheckpointRef, bool]:
        """Checkpoints with objects under the prefix, and whether their manifest is there."""
        found: dict[CheckpointRef, bool] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                parsed = parse_key(item["Key"][len(self.prefix) :])
                if parsed is not None:
                    ref, name = parsed
                    found[ref] = found.get(ref, False) or name == MANIFEST_FILENAME
        return found

    def read(self, key: str) -> bytes | None:
        """A small object in full."""
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in NOT_FOUND:
                return None
            raise

    def _head(self, key: str) -> tuple[int, str] | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in NOT_FOUND:
                return None
            raise
        return head["ContentLength"], _etag(head)

    def stats(self, keys: list[str]) -> dict[str, tuple[int, str] | None]:
        """Size and ETag of each object (HEAD)."""
        return {key: self._head(key) for key in keys}

    def part_size(self, size: int) -> int:
        """The part size for a file of `size` bytes (grown to stay within S3's part count)."""
        return max(self.part_bytes, math.ceil(size / MAX_PARTS / MIB) * MIB)

    def expected_etag(self, source: Path) -> str:
        """The multipart ETag the server reports for `source` uploaded by this store."""
        return file_fingerprint(source, S3_MULTIPART, self.part_size(source.stat().st_size))

    def upload(self, files: Uploads, transfer: Transfer) -> dict[str, str]:
        """Upload each file, resuming open multipart uploads; return each key's ETag."""
        return {key: self._upload_one(source, key, transfer) for source, key in files}

    def _upload_one(self, source: Path, key: str, transfer: Transfer) -> str:
        size = source.stat().st_size
        existing = self._head(key)
        if existing is not None and existing[0] == size:
            expected = self.expected_etag(source)
            if existing[1] == expected:
                transfer.advance(size, sent=False)
                return expected
        upload_id, done = self._open_upload(key)
        part = self.part_size(size)
        digests: list[bytes] = []
        with source.open("rb") as reader:
            # An empty file is one empty part: a multipart upload needs at least one.
            while (data := reader.read(part)) or not digests:
                digest = hashlib.md5(data).digest()
                digests.append(digest)
                number = len(digests)
                if done.get(number) == digest.hex():
                    transfer.advance(len(data), sent=False)
                    continue
                sent = self.client.upload_part(
                    Bucket=self.bucket,
                    Key=self._key(key),
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=data,
                    ContentMD5=_md5_b64(digest),
                )
                if _etag(sent) != digest.hex():
                    raise LayerError(f"{key}: part {number}: the server's ETag differs from MD5")
                transfer.advance(len(data))
        expected = multipart_etag(digests)
        parts = [{"PartNumber": n, "ETag": f'"{d.hex()}"'} for n, d in enumerate(digests, 1)]
        completed = self.client.complete_multipart_upload(
            Bucket=self.bucket,
            Key=self._key(key),
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
        )
        if _etag(completed) != expected or self._head(key) != (size, expected):
            raise LayerError(f"{key}: the object on the server does not match the upload")
        return expected

    def _open_upload(self, key: str) -> tuple[str, dict[int, str]]:
        """The newest open multipart upload of `key` with its parts (MD5 hex), or a new one."""
        listing = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self._key(key))
        uploads = sorted(
            (u for u in listing.get("Uploads", []) if u.get("Key") == self._key(key)),
            key=lambda u: u["Initiated"],
        )
        for stale in uploads[:-1]:
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self._key(key), UploadId=stale["UploadId"]
            )
        if not uploads:
            created = self.client.create_multipart_upload(Bucket=self.bucket, Key=self._key(key))
            return created["UploadId"], {}
        upload_id = uploads[-1]["UploadId"]
        done: dict[int, str] = {}
        pages = self.client.get_paginator("list_parts").paginate(
            Bucket=self.bucket, Key=self._key(key), UploadId=upload_id
        )
        for page in pages:
            for part in page.get("Parts", []):
                done[part["PartNumber"]] = _etag(part)
        return upload_id, done

    def write_last(self, items: list[tuple[str, bytes]]) -> None:
        """Small objects, one PUT each (atomic on S3), in order."""
        for key, data in items:
            digest = hashlib.md5(data).digest()
            sent = self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, ContentMD5=_md5_b64(digest)
            )
            if _etag(sent) != digest.hex():
                raise LayerError(f"{key}: the server's ETag differs from MD5")

    @contextmanager
    def download(self, key: str) -> Iterator[Iterator[bytes]]:
        """Stream one object."""
        body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        try:
            yield body.iter_chunks(CHUNK_BYTES)
        finally:
            body.close()

    def delete(self, ref: CheckpointRef) -> None:
        """The manifest first, then the rest, then any open multipart upload of the step."""
        prefix = self._key(ref.path + "/")
        manifest = prefix + MANIFEST_FILENAME
        self.client.delete_object(Bucket=self.bucket, Key=manifest)
        keys = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        ):
            keys += [item["Key"] for item in page.get("Contents", []) if item["Key"] != manifest]
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": k} for k in keys[start : start + DELETE_BATCH]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})  # type: ignore[typeddict-item]
        listing = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        for upload in listing.get("Uploads", []):
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )


def s3_client(credentials: Credentials, environ: Mapping[str, str]) -> S3Client:
    """A boto3 S3 client for a layer's or a data source's Secret (or the pod's identity)."""
    endpoint = credentials.get(SECRET_KEY_S3_ENDPOINT_URL) or environ.get(ENDPOINT_ENV)
    region = next((environ[name] for name in REGION_ENVS if environ.get(name)), DEFAULT_REGION)
    config = Config(
        # Path-style addressing works on every S3-compatible server; AWS accepts it too.
        s3={"addressing_style": "path"} if endpoint else {},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint or None,
        aws_access_key_id=credentials.get(SECRET_KEY_S3_ACCESS_KEY_ID),
        aws_secret_access_key=credentials.get(SECRET_KEY_S3_SECRET_ACCESS_KEY),
        region_name=region,
        config=config,
    )


def open_s3(
    config: LayerConfig,
    credentials: Credentials,
    environ: Mapping[str, str],
    part_bytes: int = DEFAULT_PART_BYTES,
    origin: Origin | None = None,
) -> RemoteLayer:
    """The layer of an `s3://bucket/prefix` URI, shipping for `origin`."""
    uri = urlparse(config.uri)
    if not uri.netloc:
        raise LayerError(f"{config.name}: {config.uri} names no bucket")
    store = S3Store(s3_client(credentials, environ), uri.netloc, uri.path, part_bytes)
    return RemoteLayer(config, store, credentials, origin)
