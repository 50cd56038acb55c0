"""Tool arguments checked against the tool's published input schema before any handler runs.

The low-level MCP server hands ``arguments`` over as the client sent them; a missing, mistyped or
unknown argument is answered here as an SB002 tool error that names the field, so no handler (and
no audit row) ever sees a value of the wrong type. Messages are written for the model and never
echo the offending value (it may be megabytes long).
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from ..errors import InvalidConfigError

JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
              (dict, "object"), (type(None), "null"))
_VALIDATORS: dict[str, Draft202012Validator] = {}  # tool name -> validator of its (static) schema


def check_arguments(tool: str, schema: dict[str, Any], arguments: Any) -> dict[str, Any]:
    """``arguments`` when it satisfies ``schema``; otherwise SB002 naming the first bad field."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise InvalidConfigError(f"{tool}: arguments must be a JSON object",
                                 details={"tool": tool, "field": "arguments", "constraint": "type"})
    validator = _VALIDATORS.get(tool)
    if validator is None or validator.schema is not schema:
        validator = _VALIDATORS[tool] = Draft202012Validator(schema)
    error = best_match(validator.iter_errors(arguments))
    if error is None:
        return dict(arguments)
    raise _sb002(tool, schema, arguments, error)


def _json_type(value: Any) -> str:
    for kind, name in JSON_TYPES:
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _sb002(tool: str, schema: dict[str, Any], arguments: dict[str, Any], e: ValidationError) -> InvalidConfigError:
    path = [str(p) for p in e.absolute_path]
    keyword, limit = str(e.validator), e.validator_value
    details: dict[str, Any] = {"tool": tool, "constraint": keyword}
    if keyword == "required" and not path:
        field = next((n for n in limit if n not in arguments), str(limit[0]))
        details["field"] = field
        return InvalidConfigError(f"{tool}: missing required argument {field!r}", details=details)
    if keyword == "additionalProperties" and not path:
        known = sorted(schema.get("properties", {}))
        field = sorted(k for k in arguments if k not in known)[0]
        details.update(field=field, allowed=known)
        return InvalidConfigError(f"{tool}: unknown argument {field!r}; allowed: {', '.join(known) or 'none'}",
                                  details=details)
    field = path[0] if path else "arguments"
    where = field + "".join(f"[{p}]" for p in path[1:])
    details["field"] = field
    if where != field:
        details["location"] = where
    value = e.instance
    if keyword == "type":
        wanted = " or ".join(limit) if isinstance(limit, list) else str(limit)
        text = f"must be of type {wanted}, not {_json_type(value)}"
    elif keyword == "enum":
        details["allowed"] = list(limit)
        text = "must be one of: " + ", ".join(str(v) for v in limit)
    elif keyword in ("maxLength", "minLength"):
        details["limit"] = limit
        text = (f"must be at most {limit} characters long" if keyword == "maxLength"
                else f"must be at least {limit} character{'s' if limit != 1 else ''} long")
    elif keyword in ("maxItems", "minItems"):
        details["limit"] = limit
        text = f"must have at {'most' if keyword == 'maxItems' else 'least'} {limit} items"
    elif keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        details["limit"] = limit
        op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[keyword]
        text = f"must be {op} {limit}"
    elif keyword == "pattern":
        details["pattern"] = limit
        text = f"must match the pattern {limit}"
    else:
        text = f"is not valid ({keyword})"
    return InvalidConfigError(f"{tool}: argument {where!r} {text}", details=details)
