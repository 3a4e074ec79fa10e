"""Syntax errors in the files a job reads, as one line before anything starts: the YAML of the config groups (the
runner's ``conf/``, a ``--config-dir``/``--config-path`` of the user's: its primary config and each
``group=option`` file the command names) and a pinned plan's JSON (``sharding.plan``). The line names the file,
its line and column, and what the parser expected, instead of a parser's traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List, Optional

_DIR_FLAGS = ("--config-dir", "-cd", "--config-path", "-cp")


def yaml_error(path: Path) -> Optional[str]:
    """One line for a YAML file that does not parse, else None."""
    import yaml

    try:
        yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as exc:
        def at(mark: object) -> str:
            return f"line {getattr(mark, 'line', -1) + 1}, column {getattr(mark, 'column', -1) + 1}"
        began = f" begun at {at(exc.context_mark)}" if exc.context_mark is not None else ""
        context = f" ({exc.context}{began})" if exc.context and exc.problem else ""
        return (f"{path}: YAML syntax error at {at(exc.problem_mark) if exc.problem_mark else 'its end'}: "
                f"{exc.problem or exc.context}{context}; fix the file")
    except yaml.YAMLError as exc:
        return f"{path}: YAML syntax error: {str(exc).splitlines()[0]}; fix the file"
    except (OSError, UnicodeDecodeError):
        return None  # unreadable: Hydra's own message says so
    return None


def json_error(path: Path, key: str) -> Optional[str]:
    """One line for a JSON file that does not parse, naming the key that gave it, else None."""
    try:
        json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        return f"{key}={path}: JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}; fix the file"
    except (OSError, UnicodeDecodeError):
        return None
    return None


def _user_dirs(args: List[str]) -> List[Path]:
    dirs = []
    for i, a in enumerate(args):
        flag, _, value = a.partition("=")
        if flag in _DIR_FLAGS:
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            if value:
                dirs.append(Path(value).expanduser().absolute())
    return dirs


def _named_files(folder: Path, args: List[str], config_name: Optional[str]) -> Iterable[Path]:
    """The files of ``folder`` the command names: its primary config and each ``group=option[,option]``."""
    yield folder / f"{config_name or 'config'}.yaml"
    for a in args:
        if a.startswith("-") or "=" not in a:
            continue
        group, _, options = a.lstrip("+~").partition("=")
        for option in options.split(","):
            if option and "(" not in option and "$" not in option:
                yield folder / group / f"{option.strip()}.yaml"


def config_file_error(args: List[str], conf_dir: Path, config_name: Optional[str] = None) -> Optional[str]:
    """The first syntax error in the runner's config groups or the files of the user's config folders the command
    names, as one line; None when they all parse."""
    files = sorted(conf_dir.rglob("*.yaml"))
    for folder in _user_dirs(args):
        files += [p for p in _named_files(folder, args, config_name) if p.is_file()]
    return next((e for e in (yaml_error(p) for p in files) if e), None)
