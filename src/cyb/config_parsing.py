"""Reading configuration values: typed dataclasses from nested dicts (YAML), ``--set
section.field=value`` overrides, and the docstring under each field (``--help-config``).

Nothing here knows the run's sections: :mod:`cyb.config` declares them and validates the
values; this module turns plain data into them.  Errors are :class:`ConfigError` naming the
field (``train.steps: expected an integer, got 'many'``) and, for an unknown name, the closest
known one.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
from dataclasses import fields
from typing import Any, get_args, get_origin, get_type_hints

import yaml


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


def read_yaml(path) -> Any:
    """The YAML document in the file ``path`` (an empty file: ``{}``); a :class:`ConfigError`
    naming the file when it is not YAML, or not UTF-8 text (with its first bad byte)."""
    from .data.sources import read_utf8

    try:
        return yaml.safe_load(read_utf8(path)) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except ValueError as e:  # not UTF-8
        raise ConfigError(str(e)) from None


def need(cond: bool, name: str, msg: str) -> None:
    """Raise :class:`ConfigError` ``"name: msg"`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"{name}: {msg}")


def one_of(value, allowed: tuple, name: str) -> None:
    """Raise :class:`ConfigError` naming ``name`` and ``allowed`` unless ``value`` is one of them."""
    need(value in allowed, name, f"must be one of {', '.join(map(str, allowed))}; got {value!r}")


def unknown_name(name: str, known, where: str) -> ConfigError:
    """The error for an unknown ``name`` in ``where``: the known names, and the closest one."""
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown field {name!r} in {where}{hint} (known: {', '.join(sorted(known))})")


_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True,
               "false": False, "no": False, "off": False, "0": False}


def coerce(value: Any, typ: Any, name: str) -> Any:
    """``value`` (from YAML or a ``--set`` string) as the field type ``typ``: bool, int, float,
    str, ``X | None``, ``list[X]`` or dict; ConfigError naming the field ``name`` otherwise."""
    origin = get_origin(typ)
    args = get_args(typ)
    if origin is not None and type(None) in args:  # Optional[X]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~")):
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], name)
    if value is None:
        raise ConfigError(f"{name}: may not be null (expected {getattr(typ, '__name__', typ)})")
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.strip().lower()]
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except ValueError:
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
        if not f.is_integer():
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return int(f)
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if typ is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return str(value)
    if origin is list:
        if isinstance(value, str):
            value = parse_literal(value, name)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value)]
    if typ is dict or origin is dict:
        if isinstance(value, str):
            value = parse_literal(value, name)
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def parse_literal(text: str, name: str) -> Any:
    """``text`` read as YAML (else as a Python literal); ConfigError naming ``name`` otherwise."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ConfigError(f"{name}: cannot parse {text!r} (write it as YAML, e.g. [1, 0, 1])") from None


def build(cls, data: dict, prefix: str = ""):
    """An instance of the dataclass ``cls`` from a nested dict: unknown fields and wrong types
    raise :class:`ConfigError` naming the field (``prefix``: the dotted path of ``cls``)."""
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of fields, got {data!r}")
    types = get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    for key in data:
        if key not in known:
            raise unknown_name(str(key), known, where)
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        typ = types[f.name]
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(typ):
            kwargs[f.name] = build(typ, data[f.name] if data[f.name] is not None else {}, name + ".")
        else:
            kwargs[f.name] = coerce(data[f.name], typ, name)
    return cls(**kwargs)


def apply_overrides(cfg, overrides: list[str]):
    """Apply ``section.field=value`` strings in place to ``cfg``, a dataclass whose fields are
    dataclasses (the sections), and return it; values are parsed as YAML.

    ``section.field.key=value`` sets one key of a mapping field (``data.task_kwargs.digits=4``).
    Errors name the override.
    """
    sections = [f.name for f in fields(cfg) if dataclasses.is_dataclass(get_type_hints(type(cfg))[f.name])]
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"--set {item!r}: must look like section.field=value (e.g. train.steps=100)")
        key, raw = item.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        if len(parts) not in (2, 3) or not all(parts):
            raise ConfigError(f"--set {item!r}: the key must be section.field (e.g. train.steps), got {key!r}")
        section, name = parts[0], parts[1]
        if section not in sections:
            raise unknown_name(section, sections, f"--set {item!r} (sections)")
        sec = getattr(cfg, section)
        types = get_type_hints(type(sec))
        if name not in types:
            raise unknown_name(name, types, f"--set {item!r} (section {section})")
        value = parse_literal(raw, key) if raw.strip() else ""
        if len(parts) == 3:
            if not (types[name] is dict or get_origin(types[name]) is dict):
                raise ConfigError(f"--set {item!r}: {section}.{name} is not a mapping; use {section}.{name}=value")
            setattr(sec, name, {**getattr(sec, name), parts[2]: value})
        else:
            setattr(sec, name, coerce(value, types[name], key))
    return cfg


def field_docs(sections: dict[str, type]) -> dict[str, str]:
    """``{"section.field": docstring}`` of the dataclasses ``sections`` (``{section: class}``),
    read from their source: the string literal under each field."""
    import inspect

    docs: dict[str, str] = {}
    for section, cls in sections.items():
        src = inspect.getsource(cls)
        tree = ast.parse(src)
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:] + [None]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                doc = ""
                if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
                    doc = " ".join(str(nxt.value.value).split())
                docs[f"{section}.{node.target.id}"] = doc
    return docs


__all__ = ["ConfigError", "apply_overrides", "build", "coerce", "field_docs", "need", "one_of", "parse_literal",
           "unknown_name"]
