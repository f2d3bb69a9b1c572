"""The checkpoint contract shared by the trainer harness, the pod agent and restore.

Torch-free and Kubernetes-free on purpose: the agent ships and restores checkpoints with this
package alone. A checkpoint is a directory `step-<8 digits>/` holding files and a MANIFEST.json
written last (see `manifest`); it is written as a transaction (`txn`), read only after it
verifies (`verify`), retired by keep-last-N (`retention`) and pinned while a remote layer
ships it (`pin`). `layout` documents the names in a checkpoint root. A checkpoint written by
several ranks is sharded (each rank's files under `rank-<k>/`, one global manifest written last
by the coordinator, `txn.ShardWriter`) and is verified, copied, shipped and restored as one.
"""

from trainguard.ckpt.copy import CheckpointInvalidError, copy_checkpoint
from trainguard.ckpt.hashing import (
    BLAKE3,
    DEFAULT_ALGORITHM,
    SHA256,
    XXH3_128,
    UnknownHashAlgorithmError,
    available_algorithms,
    hash_file,
    new_hasher,
)
from trainguard.ckpt.layout import (
    DIRECT_IO_ALIGN,
    parse_rank_dirname,
    parse_step_dirname,
    rank_dirname,
    step_dirname,
)
from trainguard.ckpt.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILENAME,
    Contents,
    FileEntry,
    Manifest,
)
from trainguard.ckpt.pin import (
    MAX_PINNED,
    pin_checkpoint,
    remove_pins,
    room_in_checkpoints,
    unpin_checkpoint,
)
from trainguard.ckpt.retention import PruneResult, prune, remove_checkpoint_dir, remove_partials
from trainguard.ckpt.txn import (
    CheckpointTransaction,
    CheckpointWriteError,
    Committed,
    ShardWriter,
)
from trainguard.ckpt.verify import (
    Problem,
    Scan,
    Search,
    Verification,
    find_newest_valid,
    list_checkpoint_dirs,
    scan,
    verify,
)

__all__ = [
    "BLAKE3",
    "DEFAULT_ALGORITHM",
    "DIRECT_IO_ALIGN",
    "FORMAT_VERSION",
    "MANIFEST_FILENAME",
    "MAX_PINNED",
    "SHA256",
    "XXH3_128",
    "CheckpointInvalidError",
    "CheckpointTransaction",
    "CheckpointWriteError",
    "Committed",
    "Contents",
    "FileEntry",
    "Manifest",
    "Problem",
    "PruneResult",
    "Scan",
    "Search",
    "ShardWriter",
    "UnknownHashAlgorithmError",
    "Verification",
    "available_algorithms",
    "copy_checkpoint",
    "find_newest_valid",
    "hash_file",
    "list_checkpoint_dirs",
    "new_hasher",
    "parse_rank_dirname",
    "parse_step_dirname",
    "pin_checkpoint",
    "prune",
    "rank_dirname",
    "remove_checkpoint_dir",
    "remove_partials",
    "remove_pins",
    "room_in_checkpoints",
    "scan",
    "step_dirname",
    "unpin_checkpoint",
    "verify",
]
