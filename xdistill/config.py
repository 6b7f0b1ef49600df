"""Strict configuration: nested dataclasses loaded from YAML with dotted command-line overrides.

* :func:`load_config` builds a config dataclass from a YAML file and ``key.sub=value`` overrides.
  An unknown or misspelled key is an error that names the key, where it came from and the allowed
  keys; a value of the wrong type is an error naming the key, the expected type and the value.
* Every field is documented by the ``#`` comment lines directly above it in the dataclass body;
  :func:`field_docs` reads them and :func:`describe` prints a config with its documentation
  (``xdistill config show``).

Supported field types: ``bool``, ``int``, ``float``, ``str``, ``Literal[...]``, ``X | None``,
``list[X]``, ``tuple[X, ...]``, ``dict[str, X]`` and nested dataclasses (also inside lists, which
overrides address by index: ``teachers.0.weight=0.5``).

YAML is read with YAML 1.2 floats (``1e-3``, ``5E4``, ``.5``: PyYAML's YAML 1.1 rules would
take ``1e-3`` for a string; a float field also takes ``inf``, ``-inf`` and ``nan``), YAML 1.2
integers (``010`` is ten, ``1:30`` text), booleans (only true/false) and no timestamps, merge keys
(``<<: *base``) work, a duplicate key is an error naming it with both lines, and a syntax
error names ``file:line:column``. An override that breaks the config is reported as the
command-line override it is, not as the file's fault.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from xdistill.errors import ConfigError

T = TypeVar("T")
_MISSING = object()
# words a float field also accepts (YAML's own are .inf / .nan)
_FLOAT_WORDS = ("inf", "infinity", "nan")


class _Loader(yaml.SafeLoader):
    """Safe YAML with YAML 1.2 floats and booleans, no timestamps, and an error on duplicate
    keys."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: explicit keys win
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                first = seen[key]
                raise ConfigError(f"duplicate key {key!r} at {_where(key_node.start_mark, first)} "
                                  f"(first at {_where(first, key_node.start_mark)})")
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _where(mark, other) -> str:
    """``line N``, with the column when ``other`` is on the same line."""
    if mark.line == other.line:
        return f"line {mark.line + 1}, column {mark.column + 1}"
    return f"line {mark.line + 1}"


# YAML 1.2 booleans: only true/false (any of the three casings). YAML 1.1 also read on/off/yes/no
# as booleans, so `train.wandb: off`, the documented default, became False and was refused.
# YAML 1.1 timestamps are not read either (YAML 1.2 has none): `out_dir: 2024-06-01` is text.
# Integers as YAML 1.2 reads them: `010` is ten (YAML 1.1: octal 8), `1:30` is text (YAML 1.1:
# 90); `0o17`, `0x1F`, `0b101` and `1_000` are still numbers.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (
        "tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:int")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool",
                              re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_INT = re.compile(r"^[-+]?(?:0b[01][01_]*|0o[0-7][0-7_]*|0x[0-9a-fA-F][0-9a-fA-F_]*|[0-9][0-9_]*)$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_Loader.add_implicit_resolver(  # after the ints: integers stay int
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"))


class _SourcedInt(int):
    """An int read from YAML that remembers its text, so a ``str`` field given ``0123``, ``1_000``
    or ``0x1F`` keeps what the user wrote rather than the number's repr (``83``, ``1000``, ``31``)."""
    source: str


class _SourcedFloat(float):
    """A float read from YAML that remembers its text (``1.10`` stays ``1.10``, ``1e3`` ``1e3``)."""
    source: str


def _sourced(cls: type, convert):
    def construct(loader, node):
        value = cls(convert(loader, node))
        value.source = node.value
        return value
    return construct


def _yaml12_int(loader, node) -> int:
    """A YAML 1.2 integer (:data:`_INT`): decimal even with leading zeros, or 0b/0o/0x."""
    text = node.value.replace("_", "")
    sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
    base = {"0b": 2, "0o": 8, "0x": 16}.get(digits[:2].lower(), 10)
    return sign * int(digits[2:] if base != 10 else digits, base)


_Loader.add_constructor("tag:yaml.org,2002:int", _sourced(_SourcedInt, _yaml12_int))
_Loader.add_constructor("tag:yaml.org,2002:float",
                        _sourced(_SourcedFloat, yaml.SafeLoader.construct_yaml_float))


def _plain(value: Any) -> Any:
    """``value`` with every sourced number turned back into a plain int/float (recursively)."""
    if isinstance(value, _SourcedInt):
        return int(value)
    if isinstance(value, _SourcedFloat):
        return float(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _text(value: Any) -> str:
    """What the user wrote for a scalar read as a ``str`` (a number's YAML source text)."""
    return getattr(value, "source", None) or str(value)


def yaml_load(text: str, source: str):
    """``text`` parsed by :class:`_Loader`; errors name ``source`` and the line/column."""
    try:
        return yaml.load(text, Loader=_Loader)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem})") from None


# --------------------------------------------------------------------------- documentation
@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """Map each field of dataclass ``cls`` to the ``#`` comment lines directly above it (a field
    inherited from a dataclass base keeps the base's comment unless ``cls`` declares it again)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if "__dataclass_fields__" in vars(base):
            docs.update(_own_field_docs(base))
    docs.update(_own_field_docs(cls))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    """:func:`field_docs` of the fields declared in ``cls``'s own body."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:", stripped)
        if match and pending:
            docs.setdefault(match.group(1), " ".join(pending))
        pending = []
    return docs


def undocumented_fields(cls: type) -> list[str]:
    """Dotted names of fields (recursively) that lack a documentation comment."""
    missing = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not docs.get(f.name):
            missing.append(f"{cls.__name__}.{f.name}")
        for sub in _dataclasses_in(hints[f.name]):
            missing.extend(undocumented_fields(sub))
    return missing


def _dataclasses_in(tp: Any) -> list[type]:
    if dataclasses.is_dataclass(tp):
        return [tp]
    return [c for arg in get_args(tp) for c in _dataclasses_in(arg)]


# --------------------------------------------------------------------------- type conversion
def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check/convert a YAML value to type ``tp``; ``key`` names it in errors."""
    origin = get_origin(tp)
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _text(value)
        raise ConfigError(f"{key}: expected str, got {value!r}")
    if tp is Any:
        return _plain(value)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value in get_args(tp):
            return _plain(value)
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, prefix=key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [_convert(v, item_tp, f"{key}.{i}") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        val_tp = get_args(tp)[1] if get_args(tp) else Any
        return {_text(k): _convert(v, val_tp, f"{key}.{_text(k)}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected bool (true/false), got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        raise ConfigError(f"{key}: expected int, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and value.strip().lower().lstrip("+-") in _FLOAT_WORDS:
            return float(value)  # Python's spellings: inf, -inf, Infinity, nan
        raise ConfigError(f"{key}: expected float, got {value!r}")
    if isinstance(tp, type) and isinstance(value, tp):
        return _plain(value)
    raise ConfigError(f"{key}: unsupported config type {_type_name(tp)}")


def from_dict(cls: type[T], data: dict, prefix: str = "") -> T:
    """Build dataclass ``cls`` from ``data`` strictly (unknown keys are errors)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise ConfigError(f"unknown config key {where!r}; allowed keys"
                              f"{' under ' + repr(prefix) if prefix else ''}: {', '.join(names)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            key = f"{prefix}.{f.name}" if prefix else f.name
            kwargs[f.name] = _convert(data[f.name], hints[f.name], key)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field without default is missing
        raise ConfigError(f"{prefix or cls.__name__}: {exc}") from None


def to_dict(cfg: Any) -> Any:
    """Plain-Python (YAML-serialisable) form of a config."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


# --------------------------------------------------------------------------- overrides
def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.load(raw, Loader=_Loader) if raw.strip() else ""
    except (yaml.YAMLError, ConfigError):
        value = raw
    return key.split("."), value


def apply_override(data: dict, parts: list[str], value: Any, cls: type) -> None:
    """Set ``data[parts...] = value``, checking each part against the dataclass ``cls``."""
    node: Any = data
    tp: Any = cls
    for depth, part in enumerate(parts):
        dotted = ".".join(parts[: depth + 1])
        last = depth == len(parts) - 1
        tp = _strip_optional(tp)
        if dataclasses.is_dataclass(tp):
            names = [f.name for f in dataclasses.fields(tp)]
            if part not in names:
                raise ConfigError(f"unknown config key {dotted!r} in override; allowed: "
                                  f"{', '.join(names)}")
            child_tp = typing.get_type_hints(tp)[part]
        elif get_origin(tp) in (list, tuple) or (tp is Any and isinstance(node, list)):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"override {dotted!r}: index {part} is out of range "
                                  f"(the list has {len(node)} items)")
            part = int(part)
            child_tp = get_args(tp)[0] if get_args(tp) else Any
        elif get_origin(tp) is dict or (tp is Any and isinstance(node, dict)):
            child_tp = get_args(tp)[1] if get_args(tp) else Any   # free-form: any key
        else:
            raise ConfigError(f"override {dotted!r}: {'.'.join(parts[:depth])} is not a section")
        if last:
            node[part] = value
            return
        if isinstance(node, dict) and (part not in node or node[part] is None):
            node[part] = {}
        node, tp = node[part], child_tp


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def read_utf8(path: Path, error: type[Exception], hint: str) -> str:
    """``path``'s text; text that is not UTF-8 is one ``error`` naming the file, line and
    ``hint``."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not UTF-8 text ({exc.reason}); {hint}") from None


def load_config(cls: type[T], path: str | Path | None = None,
                overrides: list[str] | tuple[str, ...] = ()) -> T:
    """Load ``cls`` from a YAML file (optional) and apply dotted overrides, strictly."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"config file {str(path)!r} is a folder; expected a YAML file")
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        text = read_utf8(path, ConfigError, "save the config as UTF-8")
        loaded = yaml_load(text, str(path))
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of config keys")
        data = loaded or {}
    try:
        base = to_dict(from_dict(cls, data))  # validates the file, fills defaults for overrides
    except ConfigError as exc:
        raise ConfigError(f"{exc} (in {path})" if path is not None else str(exc)) from None
    for text in overrides:
        parts, value = _parse_override(text)
        try:
            apply_override(base, parts, value, cls)
            from_dict(cls, base)
        except ConfigError as exc:
            raise ConfigError(f"command-line override {text!r}: {exc}") from None
    return from_dict(cls, base)


def blame_override(exc: ConfigError, overrides, path: str | Path | None = None) -> ConfigError:
    """``exc`` (raised by a range check after loading) with where the key its message names was
    set: `` (set by command-line override 'optim.lr=-1')``, else `` (in FILE)`` when the config
    file sets it; ``exc`` itself otherwise."""
    msg = str(exc)
    if "command-line override" in msg:
        return exc
    for text in reversed(list(overrides)):
        key = text.split("=", 1)[0].strip()
        if key and re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", msg):
            return ConfigError(f"{msg} (set by command-line override {text!r})")
    lead = re.match(r"[A-Za-z_]\w*(?:\.\w+)*", msg)
    if path is not None and lead and f"(in {path})" not in msg and Path(path).is_file():
        node: Any = yaml_load(Path(path).read_text(encoding="utf-8"), str(path))
        for part in lead.group(0).split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return exc
        return ConfigError(f"{msg} (in {path})")
    return exc


def describe(cfg: Any, indent: int = 0) -> str:
    """YAML-like listing of ``cfg`` with each field's documentation as a comment."""
    lines: list[str] = []
    docs = field_docs(type(cfg))
    pad = "  " * indent
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if docs.get(f.name):
            lines.append(f"{pad}# {docs[f.name]}")
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{f.name}:")
            lines.append(describe(value, indent + 1))
        elif isinstance(value, (list, tuple)) and value and dataclasses.is_dataclass(value[0]):
            lines.append(f"{pad}{f.name}:")
            for item in value:
                body = describe(item, indent + 2).lstrip()
                lines.append(f"{pad}  - {body}")
        else:
            dumped = yaml.safe_dump(to_dict(value), default_flow_style=True).strip()
            dumped = dumped.removesuffix("\n...").removesuffix("...").strip()
            lines.append(f"{pad}{f.name}: {dumped}")
            lines += _entry_template(type(cfg), f.name, value, pad)
    return "\n".join(lines)


def _entry_template(cls: type, name: str, value: Any, pad: str) -> list[str]:
    """For an empty list of dataclasses (``teachers: []``): the fields of one entry, commented
    out, so ``config show`` documents them too."""
    if value not in ([], ()):
        return []
    args = get_args(_strip_optional(typing.get_type_hints(cls)[name]))
    if not args or not dataclasses.is_dataclass(args[0]):
        return []
    try:
        example = args[0]()
    except TypeError:
        return []
    body = describe(example, 2).splitlines()
    out = [f"{pad}# each entry of {name}:"]
    for i, line in enumerate(body):
        text = line[4:] if line.startswith("    ") else line.lstrip()
        out.append(f"{pad}#   {'- ' if i == 0 else '  '}{text}")
    return out
