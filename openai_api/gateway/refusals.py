"""How the gateway refuses what a client sends, in its own words: the JSON of a body or a line
parsed (numbers as ``Decimal``), the text a client sends checked (``accounts.text``), and
pydantic's refusals turned into the gateway's errors (``validation`` and ``queries`` hold the
models).

A wrong shape (not JSON, not an object, a field of the wrong type, a missing field) is
:class:`MalformedRequest` (400); a well-formed but unacceptable value is :class:`InvalidValue`
(422). Each field's refusal reads as its :class:`Says` annotation writes it, naming the field by
its path (``messages[0].role``); the first field refused, in the model's order, is the answer.
Every string a client sends (in the body, a path, a query string) must be text PostgreSQL can keep
(no NUL, no lone surrogate; JSON at most 32 levels deep), else a 400 that names the field. A body
nested past what Python's parser takes, or an integer with more digits than Python reads, is a
400 in the gateway's words (the depth limit; the field), never Python's ("maximum recursion depth
exceeded", "Exceeds the limit (4300 digits)").
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError, core_schema

from accounts.text import MAX_JSON_DEPTH, json_problem, text_problem
from openai_api.gateway.errors import GatewayError, InvalidValue, MalformedRequest

M = TypeVar("M", bound=BaseModel)

# --- how refusals read ------------------------------------------------------------------------

MALFORMED, INVALID = "malformed", "invalid"  # the refusals' kinds: 400 and 422
# pydantic's errors for a value of the wrong type, and how a field's type is named to the client.
_TYPE_NAMES = {"int_type": "an integer", "string_type": "a string", "bool_type": "a boolean",
               "dict_type": "an object", "model_type": "an object", "list_type": "an array",
               "float_type": "a number"}  # fmt: skip


def short(value: Any) -> str:
    """``value`` as a refusal quotes it: its repr (an exception's text), at most 80 characters."""
    text = repr(value) if not isinstance(value, Exception) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def refused(kind: str, says: str, param: str | None = None) -> PydanticCustomError:
    """A refusal for pydantic to place: ``says`` with ``{param}`` for the field's path;
    ``param`` when the error names something else (a header)."""
    return PydanticCustomError(kind, "{says}", {"says": says, "param": param})


@dataclass(frozen=True)
class Says:
    """How a field's refusals read (``{param}``: the field's path; ``{input}``: what was sent).

    A value the field's type refuses (or, with ``of``, that is not an instance of ``of``) is
    the 400 "{param} must be <kind>"; one of the right type that breaks the field's
    constraints is ``invalid``, a 422 (a 400 with ``malformed``); ``required``: null is "is
    required". A part refused in its own words (a nested field) is left as it is.
    """

    kind: str = ""
    invalid: str = ""
    of: type | None = None
    required: bool = False
    malformed: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(self._checked, handler(source))

    def _checked(self, value: Any, inner: Any) -> Any:
        if value is None and self.required:
            raise refused(MALFORMED, "{param} is required")
        if value is None:
            with contextlib.suppress(ValidationError):
                return inner(value)  # a field that may be null
        if self.of is not None and not is_of(value, self.of):
            raise refused(MALFORMED, f"{{param}} must be {self.kind}")
        try:
            return inner(value)
        except ValidationError as exc:
            kinds = {e["type"] for e in exc.errors(include_url=False, include_input=False)}
            if kinds & {MALFORMED, INVALID}:
                raise
            if self.kind and self.of is None and kinds <= _TYPE_NAMES.keys():
                raise refused(MALFORMED, f"{{param}} must be {self.kind}") from None
            says = self.invalid.replace("{input}", short(value))
            raise refused(MALFORMED if self.malformed else INVALID, says) from None


def is_of(value: Any, kind: type | tuple[type, ...]) -> bool:
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, kind)


def _path(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def refusal(exc: ValidationError) -> GatewayError:
    """The gateway's error for the first refusal of a model's validation."""
    error = exc.errors(include_url=False)[0]
    where = _path(error["loc"])
    ctx = error.get("ctx") or {}
    if error["type"] in (MALFORMED, INVALID):
        kind = MalformedRequest if error["type"] == MALFORMED else InvalidValue
        return kind(ctx["says"].replace("{param}", where), param=ctx["param"] or where)
    if error["type"] == "missing":
        return MalformedRequest(f"{where} is required", param=where)
    if error["type"] in _TYPE_NAMES:
        return MalformedRequest(f"{where} must be {_TYPE_NAMES[error['type']]}", param=where)
    return InvalidValue(f"{where}: {error['msg']}", param=where or None)


def validated(model: type[M], value: Any, context: Mapping[str, Any] | None = None) -> M:
    """``value`` checked by ``model`` (``context``: what its fields read beside it, such as
    headers); the gateway's error for the first refusal."""
    try:
        return model.model_validate(value, context=context)
    except ValidationError as exc:
        raise refusal(exc) from None


# --- JSON and text ----------------------------------------------------------------------------


class _LongInteger:
    """An integer in a body with more digits than Python turns into an ``int`` (its limit,
    4300 by default): kept as the digits' count, for the error that names its field."""

    __slots__ = ("digits",)

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))


def body_parsed(raw: bytes | str, *, what: str = "the body") -> dict[str, Any]:
    """The JSON object in ``raw`` (``what``: the body, a line); numbers with a fraction or
    exponent become ``Decimal``. One nested past what the parser takes, or with an integer too
    long to read, is refused in the project's words (the depth limit, the field), not Python's."""
    longs: list[_LongInteger] = []

    def integer(text: str) -> int | _LongInteger:
        try:
            return int(text)
        except ValueError:  # too many digits (the JSON scanner passes nothing else)
            longs.append(_LongInteger(text))
            return longs[-1]

    try:
        body = json.loads(raw, parse_float=Decimal, parse_constant=Decimal, parse_int=integer)
    except RecursionError:  # json's own recursion, far past MAX_JSON_DEPTH
        raise MalformedRequest(
            f"{what} is nested deeper than {MAX_JSON_DEPTH} arrays or objects"
        ) from None
    except ValueError as exc:  # bad UTF-8 or JSON
        raise MalformedRequest(f"{what} is not valid JSON: {short(exc)}") from None
    if not isinstance(body, dict):
        raise MalformedRequest(f"{what} must be a JSON object")
    json_checked(body)  # first: it bounds the depth the walk below goes to
    long = _long_integer(body) if longs else None
    if long is not None:
        where, digits = long
        raise MalformedRequest(
            f"{where} has too many digits ({digits}) for any number the API takes", param=where
        )
    return body


def _long_integer(body: dict[str, Any]) -> tuple[str, int] | None:
    """(the field's path, its digits) of the first integer too long to read, or None."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, _LongInteger):
            return where, item.digits
        if isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))
        elif isinstance(item, dict):
            stack.extend(
                (v, f"{where}.{k}" if where else str(k)) for k, v in reversed(item.items())
            )
    return None


def json_checked(value: Any, *, path: str = "") -> None:
    """MalformedRequest naming the first field of the parsed JSON ``value`` (under ``path``)
    whose text cannot be kept (a NUL, a lone surrogate) or that is nested too deep."""
    problem = json_problem(value, path=path)
    if problem is not None:
        where, why = problem
        raise MalformedRequest(f"{where or 'the body'} {why}", param=where or None)


def text_checked(value: str, *, param: str) -> str:
    """``value`` (a path segment, a query parameter) if it is text that can be kept, else
    MalformedRequest naming ``param``."""
    problem = text_problem(value)
    if problem is not None:
        raise MalformedRequest(f"{param} {problem}", param=param)
    return value


def as_validator(check: Any) -> Any:
    """``check(value, info)`` as a validator (``info.context``: what is read beside the value,
    such as headers; ``info.data``: the fields checked before): a GatewayError it raises becomes
    the field's refusal (its own message and param)."""

    def validate(value: Any, info: ValidationInfo) -> Any:
        try:
            return check(value, info)
        except GatewayError as exc:
            kind = MALFORMED if isinstance(exc, MalformedRequest) else INVALID
            raise refused(kind, exc.message, exc.param) from None

    return validate


# A required field whose absence is refused as null is (by its Says, in its own words): checked
# when left out; the models list it as required in their schema.
LEFT_OUT_AS_NULL: Any = Field(default_factory=lambda: None, validate_default=True)
