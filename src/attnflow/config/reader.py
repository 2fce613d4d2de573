"""Reading a config file strictly: UTF-8 text, YAML without duplicated keys or octal integers, a mapping;
every refusal one ``ConfigError`` line naming the file (and the line)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..errors import ConfigError


# --- loading ---------------------------------------------------------------------------------------
class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (YAML keeps the last silently)."""


def _no_duplicates(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor`: merged keys may be overridden by the explicit ones
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"{loader.name}: key {key!r} appears twice (lines {seen[key] + 1} and "
                              f"{key_node.start_mark.line + 1}); YAML would keep the last one silently")
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _no_octal(loader, node):
    """An integer written with a leading zero (``010``) is octal to YAML 1.1 (8): refused, not guessed."""
    text = loader.construct_scalar(node)
    value = yaml.SafeLoader.construct_yaml_int(loader, node)
    if re.fullmatch(r"[-+]?0[0-9_]+", text):
        raise ConfigError(f"{loader.name}: line {node.start_mark.line + 1}: {text} has a leading zero, which "
                          f"YAML reads as the octal number {value}; write it without the zero")
    return value


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _no_octal)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """A parser's error in one line: the line of the problem, the problem, and what it was parsing
    where (its own message spreads these over several lines, the problem last)."""
    problem, mark = getattr(err, "problem", None), getattr(err, "problem_mark", None)
    if not problem or mark is None:
        return f"not valid YAML: {str(err).splitlines()[0]}"
    context, where = getattr(err, "context", None), getattr(err, "context_mark", None)
    within = f" ({context} at line {where.line + 1})" if context and where and where.line != mark.line else ""
    return f"line {mark.line + 1}: not valid YAML: {problem}{within}"


def _utf8_text(path: Path) -> str:
    """The config file's text; ``ConfigError`` naming the file and line where it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[:err.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text (byte {err.object[err.start]:#04x}); save "
                          "the config as UTF-8") from None


def check_utf8(path: str | Path) -> None:
    """``ConfigError`` (``load``'s message) for a config file that is not UTF-8, which Snakemake's own
    reader stops at with a traceback naming no file; the Snakefile checks its default config with it
    before Snakemake reads it. A file that cannot be read is left to Snakemake to report."""
    try:
        _utf8_text(Path(path))
    except OSError:
        pass


def load(path: str | Path) -> dict:
    """Read a config file strictly: duplicated keys and malformed YAML are ``ConfigError``."""
    path = Path(path)
    try:
        text = _utf8_text(path)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config ({err.strerror})") from None
    loader = _StrictLoader(text)
    loader.name = str(path)
    try:
        config = loader.get_single_data()
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {_yaml_problem(err)}") from None
    finally:
        loader.dispose()
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the config must be a mapping, got {type(config).__name__}")
    return config
