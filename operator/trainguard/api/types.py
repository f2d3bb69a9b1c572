"""Constrained value types shared by the spec models: names, paths, URIs and quantities.

Each type carries its length bound (the apiserver needs `maxLength` to price CEL rules) and its
rules with messages that say what is allowed.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, WithJsonSchema

from trainguard.api.base import (
    X_INT_OR_STRING,
    FieldRule,
    prefixed_regex_rule,
    python_regex,
    regex_rule,
)

MAX_NAME_LENGTH = 253
MAX_LABEL_LENGTH = 63
MAX_PATH_LENGTH = 1024
MAX_URI_LENGTH = 1024
MAX_QUANTITY_LENGTH = 64
MAX_ENV_NAME_LENGTH = 256

DNS_LABEL_RE = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_RE = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A '.' or '..' path segment, wherever it is.
DOT_SEGMENT_RE = "(^|/)[.][.]?(/|$)"

DnsLabel = Annotated[
    str,
    Field(min_length=1, max_length=MAX_LABEL_LENGTH),
    regex_rule(
        "must be a DNS label: lowercase letters, digits and '-', starting and ending with a "
        "letter or digit",
        must=[DNS_LABEL_RE],
    ),
]

DnsSubdomain = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_LENGTH),
    regex_rule(
        "must be a Kubernetes object name (DNS subdomain): lowercase letters, digits, '-' and "
        "'.', starting and ending with a letter or digit",
        must=[DNS_SUBDOMAIN_RE],
    ),
]

AbsolutePath = Annotated[
    str,
    Field(min_length=1, max_length=MAX_PATH_LENGTH),
    regex_rule(
        "must be an absolute path such as /data/shards: starting with '/', without empty, "
        "'.' or '..' segments and without a trailing '/'",
        must=["^(/[^/]+)+$"],
        must_not=[DOT_SEGMENT_RE],
    ),
]

RelativePath = Annotated[
    str,
    Field(min_length=1, max_length=MAX_PATH_LENGTH),
    regex_rule(
        "must be a relative path such as shards/train: not starting with '/', without "
        "'.' or '..' segments",
        must=["^[^/]"],
        must_not=[DOT_SEGMENT_RE],
    ),
]

FILE_URI_PREFIX = "file://"
HF_URI_PREFIX = "hf://"
S3_URI_PREFIX = "s3://"
SSH_URI_PREFIX = "ssh://"

Uri = Annotated[
    str,
    Field(min_length=1, max_length=MAX_URI_LENGTH),
    regex_rule(
        "must be a URI with scheme file://, s3://, hf:// or ssh://, without spaces",
        must=["^(file|s3|hf|ssh)://"],
        must_not=[" "],
    ),
    prefixed_regex_rule(
        FILE_URI_PREFIX,
        "^file://(/[^/]+)+$",
        "a file:// URI needs an absolute path, as in file:///mnt/backup/run (three slashes)",
    ),
    regex_rule(
        "a file:// URI must not contain '.' or '..' path segments",
        must_not=["^file://.*/[.][.]?(/|$)"],
    ),
    prefixed_regex_rule(
        S3_URI_PREFIX,
        "^s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9](/.*)?$",
        "an s3:// URI is s3://<bucket>[/<prefix>] with a bucket name of 3-63 lowercase "
        "letters, digits, '.' and '-'",
    ),
    prefixed_regex_rule(
        HF_URI_PREFIX,
        "^hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(/.*)?$",
        "an hf:// URI is hf://<owner>/<repository>[/<path>]",
    ),
    prefixed_regex_rule(
        SSH_URI_PREFIX,
        "^ssh://([-A-Za-z0-9._]+@)?[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?/.+$",
        "an ssh:// URI is ssh://[<user>@]<host>[:<port>]/<absolute path>",
    ),
]

# What a data source reads from the Hub: a dataset repository, written as the Hub's own client
# writes one (`datasets/` first; a bare hf://owner/name is a model repository there).
HF_DATASET_URI_RE = (
    "^hf://datasets/[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(@[^/@]+)?(/.*)?$"
)

DataUri = Annotated[
    Uri,
    prefixed_regex_rule(
        HF_URI_PREFIX,
        HF_DATASET_URI_RE,
        "an hf:// data source is a dataset repository, "
        "hf://datasets/<owner>/<name>[@<revision>][/<path>]; model repositories, spaces and "
        "buckets are not supported as data sources",
    ),
]

EnvVarName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ENV_NAME_LENGTH),
    regex_rule(
        "must be an environment variable name: letters, digits, '_', '-' and '.', not starting "
        "with a digit",
        must=["^[-._a-zA-Z][-._a-zA-Z0-9]*$"],
    ),
]

# A resource name such as nvidia.com/gpu: an optional DNS-subdomain prefix and a name.
QualifiedName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_LENGTH + 1 + MAX_LABEL_LENGTH),
    regex_rule(
        "must be a qualified name such as nvidia.com/gpu: an optional DNS prefix and '/', then "
        "letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
        must=[
            "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
            "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
        ],
    ),
]

# Kubernetes quantity without a sign: 8, 500m, 100Gi, 1.5e9.
QUANTITY_RE = (
    "^(([0-9]+([.][0-9]*)?)|([.][0-9]+))"
    "(([KMGTPE]i)|[numkMGTPE]|([eE][-+]?(([0-9]+([.][0-9]*)?)|([.][0-9]+))))?$"
)
_QUANTITY = python_regex(QUANTITY_RE)


def _is_quantity(value: Any) -> bool:
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, str) and _QUANTITY.search(value) is not None


# An int-or-string, like resource.Quantity in Kubernetes: `cpu: 8` and `size: 100Gi` both work.
# The JSON schema is written out because it is the one shape structural schemas allow for it.
Quantity = Annotated[
    int | Annotated[str, Field(max_length=MAX_QUANTITY_LENGTH)],
    WithJsonSchema(
        {
            X_INT_OR_STRING: True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "maxLength": MAX_QUANTITY_LENGTH,
        }
    ),
    FieldRule(
        cel=f"type(self) == int ? self >= 0 : self.matches('{QUANTITY_RE}')",
        message="must be a non-negative Kubernetes quantity such as 100Gi, 500M, 1.5e9 or 8",
        check=_is_quantity,
    ),
]
