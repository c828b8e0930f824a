"""Strict YAML -> typed dataclass loading, shared by every stage.

Unknown keys are errors that name the key and the file, values are type-checked, and
``--set section.key=value`` overrides are applied before the dataclasses are built, so the
resolved config that gets saved next to the outputs is exactly what ran.
"""
from __future__ import annotations

import dataclasses
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from common.errors import ConfigError

T = TypeVar("T")

# Values in messages: a few levels, items and characters, so that neither the work nor the line grows with the
# value (a value that shares its parts can stand for more items than memory holds).
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 3, 4, 4, 4
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN_CHARS = 160


def _shown(value: Any) -> str:
    text = _SHOWN.repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


# Our configs are a few sections deep; yaml composes nested nodes recursively, so a document of thousands of
# "[" would end in a RecursionError instead of a message.
_MAX_DEPTH = 50


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without aliases: ``*name`` re-uses a node, so a few lines of nested aliases (a "billion laughs"
    document) expand to more data than memory holds. Our configs never need them: each is one flat file."""

    depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ConfigError(f"{mark.name}, line {mark.line + 1}: YAML aliases (*name) are not allowed in configs; "
                              "write the value out in full")
        if self.depth >= _MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise ConfigError(f"{mark.name}, line {mark.line + 1}: values nested more than {_MAX_DEPTH} levels deep; "
                              "a config is a few sections of plain values: flatten it")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def parse_yaml(text: str, source: str) -> Any:
    """``text`` parsed as YAML, refusing aliases; ``source`` names it in the error (a ``ConfigError``)."""
    loader = None
    try:
        loader = _NoAliasLoader(text)  # refuses unprintable characters already
        loader.name = source  # shown in yaml's own error marks too
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    # A bare ``dict`` or ``list`` annotation has no origin; it is checked as ``dict[Any, Any]`` would be.
    origin = typing.get_origin(tp) or (tp if tp in (dict, list, tuple) else None)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {_shown(value)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for section {_type_name(tp)}, got {_shown(value)}")
        return _build(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {_shown(value)}")
        args = typing.get_args(tp) or (Any,)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):  # tuple[float, float]: that many items
            if len(value) != len(args):
                raise ConfigError(f"{where}: expected a list of {len(args)} values, got {len(value)}: "
                                  f"{_shown(value)}")
            return tuple(_coerce(v, item_tp, f"{where}[{i}]") for i, (v, item_tp) in enumerate(zip(value, args)))
        items = [_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {_shown(value)}")
        args = typing.get_args(tp)
        if len(args) == 2 and dataclasses.is_dataclass(args[1]):  # named sections: each value typed as its own
            return {key: _coerce(item, args[1], f"{where}.{key}") for key, item in value.items()}
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {_shown(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {_shown(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string; users write it anyway
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {_shown(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {_shown(value)}")
    return value


def _build(cls: type[T], data: dict, where: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)  # YAML keys may be numbers or null too
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(f"{where}: unknown key '{unknown[0]}' (known keys here: {known})")
    kwargs = {name: _coerce(value, hints[name], f"{where}.{name}" if where else name)
              for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from None


def from_dict(cls: type[T], data: dict | None, source: str = "<config>") -> T:
    """Build ``cls`` from a nested mapping; errors are prefixed with ``source``."""
    try:
        return _build(cls, data or {}, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {str(exc).lstrip('.: ')}") from None


def apply_overrides(data: dict, overrides: list[str] | tuple[str, ...], cls: type) -> dict:
    """Apply ``a.b=value`` strings (values parsed as YAML) to a nested dict, checking paths against ``cls``."""
    data = dict(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. instances.dupe_factor=5")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        node, node_cls = data, cls
        for depth, key in enumerate(keys):
            fields = {f.name: f for f in dataclasses.fields(node_cls)} if dataclasses.is_dataclass(node_cls) else {}
            if key not in fields:
                raise ConfigError(f"--set {item!r}: unknown key '{'.'.join(keys[:depth + 1])}'")
            field_tp = typing.get_type_hints(node_cls)[key]
            if depth == len(keys) - 1:
                node[key] = parse_yaml(raw, f"--set {path.strip()}")
            else:
                section = node.get(key) or {}
                if not isinstance(section, dict):
                    raise ConfigError(f"--set {item!r}: '{'.'.join(keys[:depth + 1])}' is {_shown(section)} in the "
                                      "config, not a section; fix the config file")
                node[key] = dict(section)
                node, node_cls = node[key], field_tp
    return data


def load(cls: type[T], path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> T:
    """Load a YAML file (or just defaults when ``path`` is None) into ``cls`` with overrides applied."""
    data: dict = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the config as "
                              "UTF-8") from None
        except OSError as exc:  # a directory, no permission
            raise ConfigError(f"{path}: cannot read the config ({exc.strerror}); pass a readable YAML file") from None
        data = parse_yaml(text, str(path)) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    data = apply_overrides(data, overrides, cls)
    return from_dict(cls, data, source)


def to_dict(config: Any) -> dict:
    """The config as plain data; a top-level section marked ``metadata={"omit_when_default": True}`` is left out
    while it holds its defaults (a section added later: resolved configs without it stay as they were)."""
    data = dataclasses.asdict(config)
    for spec in dataclasses.fields(config):
        if spec.metadata.get("omit_when_default") and getattr(config, spec.name) == spec.default_factory():
            data.pop(spec.name)
    return data


def to_yaml(config: Any) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)
