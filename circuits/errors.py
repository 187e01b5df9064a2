"""The toolkit's one error base class.

Every error the toolkit raises on purpose (bad input, a damaged file, a run that
cannot go on) derives from :class:`ToolkitError`, and also from the builtin that
fits (``ValueError``, ``LookupError``, ...), so ``except ValueError`` keeps
working. The command line prints a ``ToolkitError`` as one line and exits 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class ToolkitError(Exception):
    """Base of every error the toolkit raises on purpose; its message says what to do."""


class InputError(ToolkitError, ValueError):
    """An argument is out of its allowed range or of the wrong kind."""


class InputTypeError(InputError, TypeError):
    """An argument of the wrong type (``except TypeError`` catches it too)."""


class InputKeyError(InputError, KeyError):
    """A name that does not exist (``except KeyError`` catches it too)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TaskDataError(ToolkitError, ValueError):
    """Bad task specification or data that does not tokenize as the templates assume.

    Raised by :mod:`circuits.tasks` and :mod:`circuits.counterfactuals` (both export it).
    """
