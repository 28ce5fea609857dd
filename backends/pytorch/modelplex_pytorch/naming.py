"""Triton's PyTorch naming rules: which config.pbtxt tensor is which forward() argument or result.

Pure Python (no torch), applied once at load. Inputs, in the order Triton's libtorch backend tries them:
every configured name is a forward() argument name; else every name is `<anything>__<index>` (the
index is the argument's position); else the config's own order. Outputs: every name is
`<anything>__<index>` (position in the returned tuple, list or dict); else, for a model returning a
dict, every name is one of its keys; else the config's own order.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from modelplex import InvalidInput

log = logging.getLogger(__name__)

_NAMED_INDEX = re.compile(r"^.*__(\d+)$")


def named_index(name: str) -> int | None:
    """The index of a `<anything>__<index>` name (`INPUT__0` -> 0), else None."""
    match = _NAMED_INDEX.match(name)
    return int(match.group(1)) if match else None


def input_names(model: str, names: list[str], arg_names: list[str]) -> list[str]:
    """The client-facing name of each forward() argument, in order, for config inputs `names` (which
    may be fewer than the arguments while a config is being completed; the rest keep a default name)."""
    if all(n in arg_names for n in names):
        return list(arg_names)
    if all(named_index(n) is not None for n in names):
        positions = {n: named_index(n) for n in names}
        _check_indices(model, "input", positions, len(arg_names))
        by_index = {i: n for n, i in positions.items()}
        return [by_index.get(i, f"INPUT__{i}") for i in range(len(arg_names))]
    if len(names) > len(arg_names):
        raise InvalidInput(f"model '{model}': config.pbtxt has {len(names)} inputs but forward() takes "
                           f"{len(arg_names)} ({', '.join(arg_names)})")
    log.warning("model '%s': inputs %s are neither forward() arguments (%s) nor <name>__<index>; they are "
                "passed in config.pbtxt's order", model, names, ", ".join(arg_names))
    return list(names) + list(arg_names[len(names):])


def input_positions(model: str, names: list[str], arg_names: list[str]) -> dict[str, int]:
    """Config input name -> forward() argument position, for a complete config: as many inputs as
    forward() takes (Triton's load error otherwise)."""
    if len(names) != len(arg_names):
        raise InvalidInput(f"model '{model}': config.pbtxt has {len(names)} input(s) but the model's forward() "
                           f"takes {len(arg_names)} ({', '.join(arg_names)})")
    return {n: i for i, n in enumerate(input_names(model, names, arg_names))}


@dataclass(frozen=True, slots=True)
class OutputSelector:
    """Where one config output comes from in what forward() returns: a position or a dict key."""

    name: str
    index: int | None = None
    key: str | None = None

    def pick(self, model: str, result) -> object:
        """This output's tensor out of forward()'s result (a tensor, a tuple or list, a dict)."""
        if self.key is not None:
            if not isinstance(result, dict) or self.key not in result:
                got = f"keys {', '.join(map(str, result))}" if isinstance(result, dict) else type(result).__name__
                raise InvalidInput(f"model '{model}': output '{self.name}' is not in what forward() returned ({got})")
            return result[self.key]
        values = list(result.values()) if isinstance(result, dict) else (
            list(result) if isinstance(result, (tuple, list)) else [result])
        if self.index >= len(values):
            raise InvalidInput(f"model '{model}': output '{self.name}' is result {self.index} but forward() "
                               f"returned {len(values)}")
        return values[self.index]


def output_selectors(model: str, names: list[str], num_results: int | None,
                     keys: list[str] | None) -> list[OutputSelector]:
    """One selector per config output. `num_results`: how many results forward() returns, when the
    model says (None: known only at run time); `keys`: a dict result's keys, [] when a dict's keys are
    known only at run time, None when the result is no dict."""
    if all(named_index(n) is not None for n in names):
        positions = {n: named_index(n) for n in names}
        if num_results is not None:
            _check_indices(model, "output", positions, num_results)
        return [OutputSelector(n, index=i) for n, i in positions.items()]
    if keys is not None:
        unknown = [n for n in names if keys and n not in keys]
        if unknown:
            raise InvalidInput(f"model '{model}': output(s) {', '.join(unknown)} are not keys of the dict forward() "
                               f"returns ({', '.join(keys)}) nor <name>__<index>")
        return [OutputSelector(n, key=n) for n in names]
    if num_results is not None and len(names) > num_results:
        raise InvalidInput(f"model '{model}': config.pbtxt has {len(names)} outputs but forward() returns "
                           f"{num_results}")
    log.warning("model '%s': outputs %s do not follow <name>__<index>; they are taken in config.pbtxt's order",
                model, names)
    return [OutputSelector(n, index=i) for i, n in enumerate(names)]


def _check_indices(model: str, kind: str, positions: dict[str, int], count: int) -> None:
    for name, index in positions.items():
        if index >= count:
            raise InvalidInput(f"model '{model}': {kind} '{name}' names index {index} but the model has {count} "
                               f"{kind}(s) (indices 0-{count - 1})")
    if len(set(positions.values())) != len(positions):
        raise InvalidInput(f"model '{model}': two {kind}s name the same index: {positions}")
