"""Parsing of parameter values as Triton spells them: command-line flags, config.pbtxt `parameters`,
request parameters. One parser per kind, so "yes" means the same everywhere.

Each raises `InvalidInput` naming what it parsed (`what`), so a caller's error says which flag,
parameter or field was wrong.
"""
from __future__ import annotations

from .errors import InvalidInput

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(value: object, what: str = "value") -> bool:
    """true/false, 1/0, yes/no, on/off (any case, surrounding blanks ignored), or a real bool."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise InvalidInput(f"{what} must be true or false, got {value!r}", param=what)


def parse_int(value: object, what: str = "value", minimum: int | None = None,
              maximum: int | None = None) -> int:
    """A whole number (an int or its decimal text; bools and floats refused) within the bounds."""
    number: int | None = None
    if type(value) is int:
        number = value
    elif type(value) is str:
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None or (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        bounds = [f">= {minimum}"] if minimum is not None else []
        bounds += [f"<= {maximum}"] if maximum is not None else []
        raise InvalidInput(f"{what} must be an integer{' ' + ' and '.join(bounds) if bounds else ''}, "
                           f"got {value!r}", param=what)
    return number
