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
document uses (`compile_check`): the source of one Python function of straight-line tests, made
with `exec`, where the schema's strings are constants or reprs, never code. The predicate only
ever accepts: a body it finds valid is valid (and holds no integral float where an integer is
expected), and anything else, or anything it is unsure of, goes through jsonschema, which names
the field as before.
"""

from __future__ import annotations

import importlib
import json
import math
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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    """JSON Schema's integer, but _Unsure on an integral float: jsonschema decides and converts it."""
    if isinstance(value, float):
        if value.is_integer():
            raise _Unsure
        return False
    return isinstance(value, int) and not isinstance(value, bool)


# The test of each JSON type in generated source; an int or float (not a bool) is a "number"
# without a call, the commonest case.
_TYPE_TESTS = {
    "string": "isinstance({0}, str)", "object": "isinstance({0}, dict)", "array": "isinstance({0}, list)",
    "boolean": "({0} is True or {0} is False)", "null": "{0} is None",
    "number": "({0}.__class__ is int or {0}.__class__ is float or is_number({0}))",
    "integer": "({0}.__class__ is int or is_integer({0}))"}
_BOUNDS = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
_LENGTHS = {"minLength": ("string", ">="), "maxLength": ("string", "<="),
            "minItems": ("array", ">="), "maxItems": ("array", "<=")}
_MAX_NESTING = 6  # subschemas nested deeper go into functions of their own, within Python's limits


def compile_check(schema: Any) -> Check:
    """A predicate that accepts exactly what the schema accepts (raising _Unsure on an integral float
    in an integer field); Unsupported if the schema uses a keyword it does not know, such as `$ref`.

    The predicate is the source of one Python function, straight-line `if` tests, made with `exec`
    (as dataclasses and namedtuple make theirs); a subschema that needs a loop where only an
    expression fits (under anyOf, oneOf or not), or that is nested deep, becomes a function of its
    own beside it. Nothing from the schema is pasted in as code: its enums, patterns and other
    values are constants bound in the functions' namespace, and its property names and numbers
    are the repr() of a plain str, int or finite float (anything else is a constant too)."""
    source = _Source()
    source.function(schema)
    namespace = source.namespace
    exec(source.text(), namespace)
    return namespace["check"]


class _Source:
    """The functions of one predicate, as source lines, and the namespace their constants live in.

    A schema's tests take the source of the value they check (`v1`, `v['spec']`) and `known`, the
    JSON type earlier tests of that value have established ("number" for integers too), so they
    skip what that type makes certain."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"is_number": _is_number, "is_integer": _is_integer}
        self.functions: list[list[str]] = []
        self.names = 0

    def text(self) -> str:
        return "\n".join(line for function in self.functions for line in function) + "\n"

    def name(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def constant(self, value: Any) -> str:
        """Source for `value`: the repr of a plain str, int or finite float, else a name in the namespace."""
        if type(value) in (str, int) or (type(value) is float and math.isfinite(value)):
            return repr(value)
        name = self.name("c")
        self.namespace[name] = value
        return name

    def function(self, schema: Any, known: str | None = None) -> str:
        """A function `name(v)` that returns whether v is valid by the schema; its name."""
        name = f"check{len(self.functions) or ''}"
        lines = [f"def {name}(v):"]
        self.functions.append(lines)
        body = self.block(schema, "v", known, 0)
        lines += _indent(body)
        if body[-1:] != ["return False"]:
            lines.append("    return True")
        return name

    def block(self, schema: Any, value: str, known: str | None, depth: int) -> list[str]:
        """Statements that return False unless `value` is valid by the schema."""
        if depth >= _MAX_NESTING:
            return [f"if not {self.function(schema, known)}({value}):", "    return False"]
        lines: list[str] = []
        for test in self.tests(schema, value, known, depth, inline=False):
            if test == "False":
                return [*lines, "return False"]
            lines += [f"if not {test}:", "    return False"] if isinstance(test, str) else test
        return lines

    def expression(self, schema: Any, value: str, known: str | None, depth: int) -> str:
        """An expression, True or False, of whether `value` is valid by the schema."""
        if depth >= _MAX_NESTING:
            return f"{self.function(schema, known)}({value})"
        return _conjunction(self.tests(schema, value, known, depth, inline=True))  # type: ignore[arg-type]

    def tests(self, schema: Any, value: str, known: str | None, depth: int, inline: bool) -> list[str | list[str]]:
        """The schema's keywords, in its order, each an expression or (unless `inline`) statements."""
        if schema is True or schema == {}:
            return []
        if schema is False:
            return ["False"]
        if not isinstance(schema, dict):
            raise Unsupported(repr(schema))
        tests: list[str | list[str]] = []
        for key, argument in schema.items():
            if key in _ANNOTATIONS or key.startswith("x-"):
                continue
            if key == "allOf" and not inline:
                for branch in argument:
                    tests += self.tests(branch, value, known, depth, inline)
                continue
            test = self.keyword(key, argument, schema, value, known, depth, inline)
            if test is not None and test != "True":
                tests.append(test)
            if key == "type" and not isinstance(argument, list):
                known = known or ("number" if argument == "integer" else argument)
        return tests

    def keyword(self, key: str, argument: Any, schema: dict[str, Any], value: str, known: str | None,
                depth: int, inline: bool) -> str | list[str] | None:
        """The test of one keyword (it holds for values of the types the keyword does not apply to)."""
        if key == "type":
            names = argument if isinstance(argument, list) else [argument]
            if not set(names) <= set(_JSON_TYPES):
                raise Unsupported(f"type {names!r}")
            if known is not None and not (known == "number" and "integer" in names):
                return "True" if known in names else "False"
            return _disjunction([_TYPE_TESTS[name].format(value) for name in names])
        if key in ("enum", "const"):
            options = argument if key == "enum" else [argument]
            if not all(isinstance(o, str) for o in options):
                raise Unsupported(f"{key} of non-strings")
            return _where("string", value, known, f"{value} in {self.constant(frozenset(options))}", "False")
        if key in _BOUNDS:
            if not _is_number(argument):
                raise Unsupported(key)
            return _where("number", value, known, f"{value} {_BOUNDS[key]} {self.constant(argument)}")
        if key in _LENGTHS:
            json_type, compare = _LENGTHS[key]
            return _where(json_type, value, known, f"len({value}) {compare} {self.constant(argument)}")
        if key == "pattern":
            return _where("string", value, known, f"{self.constant(re.compile(argument).search)}({value}) is not None")
        if key == "required":
            names = dict.fromkeys(argument)  # hashable, like the names of any object
            return _where("object", value, known, _conjunction([f"{self.constant(n)} in {value}" for n in names]))
        if key == "items":
            return self.loop("array", {"items": argument}, value, known, depth, inline)
        if key in ("properties", "additionalProperties"):
            if key == "additionalProperties" and "properties" in schema:
                return None  # checked with the properties
            properties = argument if key == "properties" else {}
            additional = schema.get("additionalProperties", True) if key == "properties" else argument
            if inline and (additional is True or additional is False) \
                    and not any(_may_be_unsure(s) for s in properties.values()):
                return self.properties_expression(properties, additional is False, value, known, depth)
            return self.loop("object", {"properties": properties, "additionalProperties": additional},
                             value, known, depth, inline)
        if key in ("allOf", "anyOf", "oneOf"):
            branches = [self.expression(branch, value, known, depth + 1) for branch in argument]
            if key == "allOf":
                return _conjunction(branches)
            if key == "anyOf":
                return _disjunction(branches)
            return f"({' + '.join(f'({b})' for b in branches)} == 1)" if branches else "False"
        if key == "not":
            return f"(not {self.expression(argument, value, known, depth + 1)})"
        raise Unsupported(key)

    def loop(self, json_type: str, schema: dict[str, Any], value: str, known: str | None, depth: int,
             inline: bool) -> str | list[str] | None:
        """The test of `items` or `properties` (`schema` holds only them): a loop over the array or
        object, or, where an expression is needed, a call of a function holding it."""
        if known not in (None, json_type):
            _Source().function(schema)  # never applies, but Unsupported all the same
            return None
        if inline:
            return _where(json_type, value, known, f"{self.function(schema, json_type)}({value})")
        if "items" in schema:
            item = self.name("v")
            body = self.block(schema["items"], item, None, depth + 1)
            lines = [f"for {item} in {value}:", *_indent(body)] if body else []
        else:
            lines = self.properties_loop(schema["properties"], schema["additionalProperties"], value, depth)
        if not lines or known == json_type:
            return lines or None
        return [f"if {_TYPE_TESTS[json_type].format(value)}:", *_indent(lines)]

    def properties_loop(self, properties: dict[str, Any], additional: Any, value: str, depth: int) -> list[str]:
        """A loop over the object's items in their order, each tested by the schema of its name."""
        number = self.name("")
        key, item = f"k{number}", f"v{number}"
        branches = [(self.constant(name), self.block(schema, item, None, depth + 1))
                    for name, schema in properties.items()]
        other = [] if additional is True else self.block(additional, item, None, depth + 1)
        if not other:
            branches = [(name, body) for name, body in branches if body]
        if not branches:
            return [f"for {item} in {value}.values():", *_indent(other)] if other else []
        lines = [f"for {key}, {item} in {value}.items():"]
        for i, (name, body) in enumerate(branches):
            lines += _indent([f"{'elif' if i else 'if'} {key} == {name}:", *_indent(body or ["pass"])])
        if other:
            lines += _indent(["else:", *_indent(other)])
        return lines

    def properties_expression(self, properties: dict[str, Any], closed: bool, value: str, known: str | None,
                              depth: int) -> str:
        """`properties` as an expression, each present property tested in turn: only where no test can
        raise _Unsure, as the object's order would decide which comes first."""
        tests = []
        for name, schema in properties.items():
            key = self.constant(name)
            test = self.expression(schema, f"{value}[{key}]", None, depth + 1)
            if test != "True":
                tests.append(f"({key} not in {value} or {test})")
        if closed:
            tests.append(f"{value}.keys() <= {self.constant(frozenset(properties))}")
        return _where("object", value, known, _conjunction(tests))


def _where(json_type: str, value: str, known: str | None, test: str, elsewhere: str = "True") -> str:
    """`test` for values of the JSON type, `elsewhere` for the others."""
    if known == json_type:
        return test
    if known is not None or (test == "True" and elsewhere == "True"):
        return elsewhere
    guard = _TYPE_TESTS[json_type].format(value)
    return f"({guard} and {test})" if elsewhere == "False" else f"(not {guard} or {test})"


def _conjunction(tests: list[str]) -> str:
    tests = [t for t in tests if t != "True"]
    return "True" if not tests else tests[0] if len(tests) == 1 else f"({' and '.join(tests)})"


def _disjunction(tests: list[str]) -> str:
    tests = [t for t in tests if t != "False"]
    return "False" if not tests else tests[0] if len(tests) == 1 else f"({' or '.join(tests)})"


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


def _may_be_unsure(schema: Any) -> bool:
    """Whether checking by the schema may raise _Unsure: it names the integer type somewhere."""
    if isinstance(schema, list):
        return any(_may_be_unsure(item) for item in schema)
    if not isinstance(schema, dict):
        return False
    types = schema.get("type")
    return "integer" in (types if isinstance(types, list) else [types]) or _may_be_unsure(list(schema.values()))


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
