"""The model base class and the rule machinery that keeps pydantic and the CRD in agreement.

Every constraint of the API is declared once and enforced twice: by pydantic when trainguard
parses an object, and by the kube-apiserver (OpenAPI keywords and CEL `x-kubernetes-validations`)
when a user applies one. Keywords such as `minimum` or `enum` come from pydantic's own JSON
schema. Rules that need an expression are declared here as pairs of a CEL expression and its
Python twin with one shared message, so the two can only drift if the pair itself is wrong (the
apiserver test tier checks that they agree on a table of invalid runs and on random specs).

Messages name what is allowed; the apiserver prefixes them with the field path, and pydantic
reports them at the same location, so both point the user at the same field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, InitErrorDetails, PydanticCustomError, core_schema

X_VALIDATIONS = "x-kubernetes-validations"
X_LIST_TYPE = "x-kubernetes-list-type"
X_LIST_MAP_KEYS = "x-kubernetes-list-map-keys"
X_INT_OR_STRING = "x-kubernetes-int-or-string"

# pydantic error type of a failed rule, so callers can tell rule failures from type errors.
RULE_ERROR_TYPE = "rule"


def python_regex(regex: str) -> re.Pattern[str]:
    r"""Compile a rule regex for Python with RE2's meaning.

    CEL's `matches()` uses RE2, where `$` matches only at the very end of the text; Python's `$`
    also matches before a trailing newline. Rule regexes use `$` only as an anchor, so `\Z`
    gives Python the RE2 meaning.
    """
    return re.compile(regex.replace("$", r"\Z"))


def _rule_error(message: str) -> PydanticCustomError:
    # The message is a template for PydanticCustomError: braces would be read as placeholders.
    return PydanticCustomError(RULE_ERROR_TYPE, message.replace("{", "(").replace("}", ")"))


@dataclass(frozen=True)
class FieldRule:
    """A rule on one value, used as `Annotated[T, FieldRule(...)]`.

    `cel` sees the value as `self`; `check` is its Python twin and gets the validated value.
    """

    cel: str
    message: str
    check: Callable[[Any], bool]

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema.setdefault(X_VALIDATIONS, []).append(
            {"rule": self.cel, "message": self.message}
        )
        return json_schema

    def _validate(self, value: Any) -> Any:
        if not self.check(value):
            raise _rule_error(self.message)
        return value


def regex_rule(message: str, must: Sequence[str] = (), must_not: Sequence[str] = ()) -> FieldRule:
    """A string rule: every `must` regex is found in the value and no `must_not` regex is.

    Regexes are searched, not fully matched (CEL `matches()` semantics): anchor them.
    Keep them free of quotes and backslashes so they read the same in CEL and Python.
    """
    cel = " && ".join(
        [f"self.matches('{r}')" for r in must] + [f"!self.matches('{r}')" for r in must_not]
    )
    found = [python_regex(r) for r in must]
    absent = [python_regex(r) for r in must_not]

    def check(value: str) -> bool:
        return all(r.search(value) for r in found) and not any(r.search(value) for r in absent)

    return FieldRule(cel=cel, message=message, check=check)


def prefixed_regex_rule(prefix: str, regex: str, message: str) -> FieldRule:
    """A string rule that applies only to values starting with `prefix` (e.g. a URI scheme)."""
    compiled = python_regex(regex)

    def check(value: str) -> bool:
        return not value.startswith(prefix) or compiled.search(value) is not None

    return FieldRule(
        cel=f"!self.startsWith('{prefix}') || self.matches('{regex}')",
        message=message,
        check=check,
    )


def unique_by(key: str, attribute: str, message: str) -> FieldRule:
    """A list rule: no two items share the same `key` (camelCase; `attribute` in Python)."""

    def check(items: list[Any]) -> bool:
        values = [getattr(item, attribute) for item in items]
        return len(set(values)) == len(values)

    return FieldRule(
        cel=f"self.all(a, self.exists_one(b, b.{key} == a.{key}))", message=message, check=check
    )


def map_list(key: str) -> dict[str, Any]:
    """Schema markers of a list keyed by `key`: server-side apply merges its items by key."""
    return {X_LIST_TYPE: "map", X_LIST_MAP_KEYS: [key]}


@dataclass(frozen=True)
class ObjectRule:
    """A cross-field rule on one model, listed in the model's `object_rules`.

    `field` is the camelCase path (dots for nesting) of the field the rule blames: the
    apiserver reports it through the rule's `fieldPath`, pydantic as the error location.
    A message that names the offending values is given twice, alike: `message_expression`
    (CEL, for the apiserver) and `describe` (for pydantic); `message` stays the apiserver's
    fallback when the expression cannot be evaluated.
    """

    cel: str
    message: str
    check: Callable[[Any], bool]
    field: str | None = None
    message_expression: str | None = None
    describe: Callable[[Any], str] | None = None

    @property
    def loc(self) -> tuple[str, ...]:
        """The pydantic error location of the blamed field, relative to the model."""
        return tuple(self.field.split(".")) if self.field else ()

    def as_cel(self) -> dict[str, str]:
        """The rule as an entry of `x-kubernetes-validations`."""
        rule = {"rule": self.cel, "message": self.message}
        if self.message_expression:
            rule["messageExpression"] = self.message_expression
        if self.field:
            rule["fieldPath"] = f".{self.field}"
        return rule

    def failure(self, model: Any) -> str:
        """The message of this rule's failure on `model` (what the apiserver would say)."""
        return self.describe(model) if self.describe is not None else self.message


def _object_rules_schema(schema: dict[str, Any], model: type[Any]) -> None:
    rules: tuple[ObjectRule, ...] = model.__dict__.get("object_rules", ())
    if rules:
        schema[X_VALIDATIONS] = [rule.as_cel() for rule in rules]


class KubeModel(BaseModel):
    """Base of every API model: camelCase JSON names, no unknown fields, strict types.

    Strict types mirror the apiserver, which refuses `"3"` where an integer is meant. An
    explicit null means "not set" (the apiserver prunes nulls of fields that are not nullable,
    which is every field here, before defaulting), so nulls are dropped before validation.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        strict=True,
        json_schema_extra=_object_rules_schema,
    )

    # Cross-field rules of this model (not inherited: each model lists its own).
    object_rules: ClassVar[tuple[ObjectRule, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    @model_validator(mode="after")
    def _check_object_rules(self) -> Self:
        failed = [
            rule for rule in type(self).__dict__.get("object_rules", ()) if not rule.check(self)
        ]
        if failed:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(type=_rule_error(rule.failure(self)), loc=rule.loc, input=self)
                    for rule in failed
                ],
            )
        return self

    @classmethod
    def from_object(cls, obj: Any) -> Self:
        """Parse an object as the apiserver would see it: camelCase names only."""
        return cls.model_validate(obj, by_alias=True, by_name=False)

    def to_object(self) -> dict[str, Any]:
        """The JSON form (camelCase, unset optional fields left out) for the apiserver."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
