"""Every request checked against the OpenAPI document's own schemas, by one mechanism for all routes.

A body is parsed with bounds (nesting depth; NaN and Infinity spelled out; lone UTF-16
surrogates, which JSON can spell but no store can keep) and then validated with jsonschema
against the schema the document publishes for its operation, as are the declared query
parameters. So the API accepts exactly what the document says, and the first problem becomes an
`InputError` naming the field (`spec.memory_gib`, `holders[2]`, `all`) and saying what is wrong
in a few words, never echoing the value. As JSON Schema says, 2.0 is an integer: a valid body's
integral floats in integer fields reach the handlers as ints.

jsonschema is slow for the small bodies every kernel sends many times a minute (touch,
heartbeat), so each body schema is also compiled into a plain predicate for the keywords the
document uses (`compile_check`). The predicate only ever accepts: a body it finds valid is
valid (and holds no integral float where an integer is expected), and anything else, or
anything it is unsure of, goes through jsonschema, which names the field as before.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from typing import Any, Callable, Iterator


def _import_jsonschema_without_iri_grammar() -> None:
    """Import jsonschema without rfc3987_syntax, where nothing in this process has imported it yet.

    Where rfc3987_syntax is installed (jupyter-events pulls it in), jsonschema imports it to
    register an "iri" format checker, and it compiles its 38 grammars at import: 1.6-1.9 s of
    each service start, two thirds of the service's imports. The validators here check no
    format. rfc3987_syntax stays importable afterwards; only jsonschema's format checker in this
    process goes without "iri", as where the package is not installed. In a Jupyter server,
    jupyter_events has imported jsonschema long before this module, which then changes nothing."""
    if "jsonschema" in sys.modules or "rfc3987_syntax" in sys.modules:
        return
    sys.modules["rfc3987_syntax"] = None  # an ImportError for jsonschema's guarded import
    try:
        importlib.import_module("jsonschema")
    finally:
        del sys.modules["rfc3987_syntax"]


_import_jsonschema_without_iri_grammar()

from jsonschema import Draft202012Validator, ValidationError, validators  # noqa: E402
from jsonschema.exceptions import best_match  # noqa: E402

MAX_DEPTH = 10
_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_TYPES = {"object": "an object", "array": "an array", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false", "null": "null"}


# A validator for which 2.0 is not an integer: its only complaints about a valid body are the
# integral floats that integer fields hold.
_IntegersOnly = validators.extend(Draft202012Validator, type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)))


class InputError(ValueError):
    """A request value the API refuses; `field` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class _SpelledOut:
    """NaN, Infinity or -Infinity in a JSON text: not JSON numbers, kept to name their field."""

    def __init__(self, token: str):
        self.token = token


def parse_json(raw: bytes) -> Any:
    """A JSON text -> Python values; InputError on bad UTF-8, bad JSON, deep nesting, NaN, lone surrogates.

    The values are walked only when the text could hold one of the last three: a NaN or Infinity
    was parsed, a \\u escape (the only way to a lone surrogate in valid UTF-8) is there, or there
    are more brackets than MAX_DEPTH."""
    spelled: list[str] = []

    def constant(token: str) -> _SpelledOut:
        spelled.append(token)
        return _SpelledOut(token)
    try:
        text = raw.decode("utf-8")
        data = json.loads(text, parse_constant=constant)
    except UnicodeDecodeError:
        raise InputError("body", "is not UTF-8") from None
    except RecursionError:
        raise InputError("body", f"is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        raise InputError("body", f"is not valid JSON ({str(err).split(':')[0]})") from None
    if spelled or "\\u" in text or text.count("{") + text.count("[") > MAX_DEPTH:
        _check_values(data)
    return data


def _check_values(data: Any) -> None:
    """InputError at the first value nested too deep, spelled out (NaN, Infinity) or holding a lone surrogate."""
    for path, value, depth in _walk(data):
        if depth > MAX_DEPTH:
            raise InputError(path or "body", f"is nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, _SpelledOut):
            raise InputError(path or "body", f"must be a finite number, not {value.token}")
        if isinstance(value, str) and _SURROGATE.search(value):
            raise InputError(path or "body", "holds a lone UTF-16 surrogate")


def _walk(data: Any) -> Iterator[tuple[str, Any, int]]:
    """(field path, value, depth) of every value and object key, without recursion."""
    stack = [("", data, 0)]
    while stack:
        path, value, depth = stack.pop()
        yield path, value, depth
        if isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else key
                yield child, key, depth + 1
                stack.append((child, item, depth + 1))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value))


def field_name(error: ValidationError) -> str:
    """The request field a schema error is about: the missing, unknown or offending property."""
    parts = list(error.absolute_path)
    if error.validator == "required":
        parts.append(next(p for p in error.validator_value if p not in error.instance))
    elif error.validator == "additionalProperties":
        known = error.schema.get("properties", {})
        parts.append(next(k for k in error.instance if k not in known))
    elif "x-field" in error.schema:
        parts.append(error.schema["x-field"])
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"


def describe(error: ValidationError) -> str:
    """A schema error in a few words, without the offending value."""
    keyword, expected = error.validator, error.validator_value
    if keyword == "required":
        return "is required"
    if keyword == "additionalProperties":
        return "is not a field of this request"
    if keyword == "type":
        types = expected if isinstance(expected, list) else [expected]
        return "must be " + " or ".join(_JSON_TYPES[t] for t in types)
    if keyword in ("enum", "const"):
        values = expected if keyword == "enum" else [expected]
        return "must be one of " + ", ".join(json.dumps(v) for v in values)
    if keyword == "minimum":
        return f"must be at least {expected}"
    if keyword == "exclusiveMinimum":
        return f"must be above {expected}"
    if keyword == "maximum":
        return f"must be at most {expected}"
    if keyword == "minLength":
        return f"must be at least {expected} character{'s' if expected != 1 else ''}"
    if keyword == "maxLength":
        return f"must be at most {expected} characters"
    if keyword == "maxItems":
        return f"must have at most {expected} items"
    while error is not None:  # a rule stated on the schema or on the anyOf/oneOf around it
        if "x-rule" in error.schema:
            return error.schema["x-rule"]
        error = error.parent
    return f"does not match the document ({keyword})"


def inline_refs(schema: Any, components: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """The schema with each local `$ref` replaced by what it names (a cycle keeps its `$ref`):
    jsonschema resolves a `$ref` through its registry on every check, a third of a small body's cost."""
    if isinstance(schema, list):
        return [inline_refs(item, components, seen) for item in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/") and ref not in seen and len(schema) == 1:
        target: Any = {"components": components}
        for part in ref[2:].split("/"):
            target = target[part]
        return inline_refs(target, components, (*seen, ref))
    return {key: inline_refs(value, components, seen) for key, value in schema.items()}


# -------------------------------------------------------------------- the fast predicate

Check = Callable[[Any], bool]
_ANNOTATIONS = {"description", "title", "format", "default", "examples", "example", "deprecated", "readOnly",
                "writeOnly", "$comment"}  # format is an annotation: the validators here have no format checker


class Unsupported(ValueError):
    """A schema uses a keyword the fast predicate does not know: jsonschema alone checks it."""


class _Unsure(Exception):
    """An integral float met an integer type: jsonschema decides, and turns it into an int."""


def _is_type(name: str, value: Any) -> bool:
    if name == "string":
        return isinstance(value, str)
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if name == "number":
        return True
    if isinstance(value, float) and value.is_integer():  # integer: jsonschema decides and converts
        raise _Unsure
    return isinstance(value, int)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _keyword(key: str, value: Any, schema: dict[str, Any]) -> Check | None:
    """The predicate of one keyword (it holds for values of the types the keyword does not apply to)."""
    if key == "type":
        names = value if isinstance(value, list) else [value]
        if not set(names) <= set(_JSON_TYPES):
            raise Unsupported(f"type {names!r}")
        return lambda v: any(_is_type(name, v) for name in names)
    if key in ("enum", "const"):
        options = value if key == "enum" else [value]
        if not all(isinstance(o, str) for o in options):
            raise Unsupported(f"{key} of non-strings")
        allowed = frozenset(options)
        return lambda v: isinstance(v, str) and v in allowed
    if key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if not _is_number(value):
            raise Unsupported(key)
        compare = {"minimum": lambda v: v >= value, "maximum": lambda v: v <= value,
                   "exclusiveMinimum": lambda v: v > value, "exclusiveMaximum": lambda v: v < value}[key]
        return lambda v: not _is_number(v) or compare(v)
    if key == "minLength":
        return lambda v: not isinstance(v, str) or len(v) >= value
    if key == "maxLength":
        return lambda v: not isinstance(v, str) or len(v) <= value
    if key == "pattern":
        search = re.compile(value).search
        return lambda v: not isinstance(v, str) or search(v) is not None
    if key == "minItems":
        return lambda v: not isinstance(v, list) or len(v) >= value
    if key == "maxItems":
        return lambda v: not isinstance(v, list) or len(v) <= value
    if key == "items":
        item = compile_check(value)
        return lambda v: not isinstance(v, list) or all(item(x) for x in v)
    if key == "required":
        names = tuple(value)
        return lambda v: not isinstance(v, dict) or all(n in v for n in names)
    if key == "properties":
        return _properties(value, schema.get("additionalProperties", True))
    if key == "additionalProperties":
        if "properties" in schema:
            return None  # checked with the properties
        return _properties({}, value)
    if key in ("allOf", "anyOf", "oneOf"):
        branches = [compile_check(branch) for branch in value]
        if key == "allOf":
            return lambda v: all(b(v) for b in branches)
        if key == "anyOf":
            return lambda v: any(b(v) for b in branches)
        return lambda v: sum(1 for b in branches if b(v)) == 1
    if key == "not":
        inner = compile_check(value)
        return lambda v: not inner(v)
    raise Unsupported(key)


def _properties(properties: dict[str, Any], additional: Any) -> Check:
    known = {name: compile_check(schema) for name, schema in properties.items()}
    other = None if additional is True else compile_check(additional)

    def check(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        for name, item in value.items():
            found = known.get(name)
            if found is not None:
                if not found(item):
                    return False
            elif other is not None and not other(item):
                return False
        return True
    return check


def compile_check(schema: Any) -> Check:
    """A predicate that accepts exactly what the schema accepts (raising _Unsure on an integral float
    in an integer field); Unsupported if the schema uses a keyword it does not know, such as `$ref`."""
    if schema is True or schema == {}:
        return lambda v: True
    if schema is False:
        return lambda v: False
    if not isinstance(schema, dict):
        raise Unsupported(repr(schema))
    checks = []
    for key, value in schema.items():
        if key in _ANNOTATIONS or key.startswith("x-"):
            continue
        check = _keyword(key, value, schema)
        if check is not None:
            checks.append(check)
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(c(v) for c in checks)


def fast_check(schema: Any) -> Check | None:
    """`compile_check` of a body schema, or None if it uses what the predicate does not know."""
    try:
        return compile_check(schema)
    except Unsupported:
        return None


def accepts(check: Check | None, data: Any) -> bool:
    """Whether the fast predicate is sure `data` is valid (and needs no integer conversion)."""
    if check is None:
        return False
    try:
        return check(data)
    except _Unsure:
        return False


class RequestValidator:
    """The request schemas of an OpenAPI document, compiled once, checked per operation."""

    def __init__(self, document: dict[str, Any]):
        components = document["components"]
        self._bodies: dict[tuple[str, str], tuple[Draft202012Validator, Draft202012Validator]] = {}
        self._fast: dict[tuple[str, str], Check | None] = {}
        self._queries: dict[tuple[str, str], dict[str, Draft202012Validator]] = {}
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                if method == "parameters":
                    continue
                key = (path, method.upper())
                content = operation.get("requestBody", {}).get("content", {}).get("application/json")
                if content is not None:
                    inlined = inline_refs(content["schema"], components)
                    schema = {**inlined, "components": components}
                    self._bodies[key] = (Draft202012Validator(schema), _IntegersOnly(schema))
                    self._fast[key] = fast_check(inlined)
                parameters = operations.get("parameters", []) + operation.get("parameters", [])
                self._queries[key] = {
                    p["name"]: Draft202012Validator({**p["schema"], "components": components})
                    for p in parameters if p["in"] == "query"}

    def has_body(self, route: str, method: str) -> bool:
        return (route, method) in self._bodies

    def check_query(self, route: str, method: str, arguments: dict[str, list[bytes]]) -> None:
        """Each declared query parameter given once, valid by its schema; others are not ours."""
        for name, validator in self._queries.get((route, method), {}).items():
            values = arguments.get(name)
            if values is None:
                continue
            if len(values) > 1:
                raise InputError(name, "must be given once")
            try:
                value = values[0].decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(name, "is not UTF-8") from None
            self._raise_first(validator, value, prefix=name)

    def check_body(self, route: str, method: str, data: Any) -> None:
        """Raise InputError unless `data` is valid; then turn its integral floats in integer fields into ints."""
        if accepts(self._fast[(route, method)], data):
            return
        validator, integers_only = self._bodies[(route, method)]
        self._raise_first(validator, data)
        errors = list(integers_only.iter_errors(data))
        while errors:
            error = errors.pop()
            errors.extend(error.context or ())
            expected = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
            if error.validator == "type" and "integer" in expected and isinstance(error.instance, float) \
                    and error.instance.is_integer() and error.absolute_path:
                *parents, last = error.absolute_path
                container = data
                for part in parents:
                    container = container[part]
                container[last] = int(error.instance)

    @staticmethod
    def _raise_first(validator: Draft202012Validator, value: Any, prefix: str = "") -> None:
        error = best_match(validator.iter_errors(value))
        if error is not None:
            name = field_name(error)
            raise InputError(prefix if prefix and name == "body" else name, describe(error))
