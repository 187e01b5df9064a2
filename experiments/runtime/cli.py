"""The command line every experiment shares: one parser style, flags checked before a model loads, errors as one line.

A researcher meets the toolkit through ``python -m experiments.<name>``; three rules make that meeting short:

* **Flags are checked when they are parsed**, not when a late stage first uses them: the argparse
  ``type=`` functions here (:func:`positive_int`, :func:`nonnegative_int`, :func:`int_list`,
  :func:`device`, ...) reject ``--top-k 0``, ``--knockout-ks a,b`` or ``--device cuda`` on a CPU-only
  torch before any data is built or any model loaded.
* **Bad input is one line, not a traceback.** :func:`run_cli` runs an experiment's ``main``; an argparse
  error or a :class:`circuits.errors.ToolkitError` (raised on purpose for bad input or a damaged file)
  prints ``<prog>: error: <what was wrong>`` and, where the message has one, ``hint: <what to do>`` on
  stderr and exits with status 2. ``--debug`` shows the full traceback instead. Any other exception is a
  bug and keeps its traceback.
* **Flags come from a config**: an experiment declares a frozen dataclass whose fields are its settings
  (:func:`option` adds the help text and the parse-time check); :func:`parse_config` builds the parser
  from it, so the defaults live in one place and ``results.json`` records ``dataclasses.asdict(config)``.
  ``--device`` and ``--dtype`` are fields of :class:`experiments.runtime.settings.RunSettings`, checked by
  :func:`device` (``auto`` = CUDA when present) and :data:`DTYPES`, the same in every experiment.
* **``--help`` reads like a man page**: ``python -m experiments.<name>`` as the program name, the module
  docstring with its line breaks (reStructuredText double backticks dropped), every flag described, and
  its default shown once (not when the help text already states it, nor when it is ``None``/off).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import signal
import sys
import threading
from functools import wraps
from typing import Any, Callable, Sequence, TypeVar

from circuits.errors import ToolkitError

DEBUG_FLAG = "--debug"
DTYPES = ("float32", "float16", "bfloat16")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks; appends "(default: X)" once, where it says something."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        quiet = action.default is None or action.default is False or action.default == argparse.SUPPRESS \
            or action.default == () or not action.option_strings
        if quiet or "(default" in text or "default:" in text:
            return text
        if isinstance(action.default, tuple):  # several values: as they are typed
            return f"{text} (default: {' '.join(map(str, action.default))})"
        return f"{text} (default: %(default)s)"


class ExperimentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line plus a hint (not the whole usage), exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {message}\nhint: `{self.prog} --help` lists every flag.", file=sys.stderr)
        sys.exit(2)


def plain_docstring(doc: str | None) -> str:
    """A module docstring for the terminal: reStructuredText ``double backticks`` dropped, line breaks kept."""
    return re.sub(r"``(.+?)``", r"\1", doc or "").strip("\n")


def make_parser(name: str, doc: str | None) -> ExperimentParser:
    """The parser of ``python -m experiments.<name>``, described by ``doc`` (the module docstring), with ``--debug``."""
    parser = ExperimentParser(prog=f"python -m experiments.{name}", description=plain_docstring(doc),
                              formatter_class=_HelpFormatter)
    parser.add_argument(DEBUG_FLAG, action="store_true", help="show the full traceback of an error")
    return parser


# ---------------------------------------------------------------------------- flag types (checked at parse time)


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A float in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return value


def int_list(text: str) -> str:
    """A comma-separated list of integers >= 1 such as ``1,2,4,8`` (returned as given, for the config)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() and int(t) >= 1 for t in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 such as 1,2,4,8, got {text!r}")
    return text


def figure_formats(text: str) -> str:
    """``svg,pdf,png`` (any subset): the static figure formats, checked with kaleido's presence (returned as given)."""
    from circuits.show.static_export import parse_formats, require_kaleido

    try:
        if parse_formats(text):
            require_kaleido()
    except ToolkitError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def device(text: str) -> str:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, checked against what this torch build can use."""
    if text == "auto":
        return text
    import torch  # here, not at import: a parser is built (and --help answered) before torch loads

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "is a CPU-only build" if torch.version.cuda is None else "sees no CUDA GPU"
            raise argparse.ArgumentTypeError(f"{text!r} is not available: torch {torch.__version__} {why}; "
                                             f"use --device cpu (or auto)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text!r} is not available: {torch.cuda.device_count()} CUDA "
                                             f"device(s) visible")
    elif dev.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise argparse.ArgumentTypeError(f"{text!r} is not available on this machine; use --device cpu (or auto)")
    elif dev.type != "cpu":
        raise argparse.ArgumentTypeError(f"unsupported device {text!r}; use auto, cpu, cuda, cuda:N or mps")
    return text


# ---------------------------------------------------------------------------- running and reporting errors


def error_lines(prog: str, err: BaseException) -> str:
    """``<prog>: error: <first line>`` and, from the rest of the message, ``hint: ...`` (whitespace collapsed)."""
    first, _, rest = str(err).strip().partition("\n")
    text = f"{prog}: error: {first}"
    hint = " ".join(rest.split())
    return text + (f"\nhint: {hint}" if hint else "")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a batch scheduler's stop, a launcher stopping the other processes), raised where the
    run is, so that the run folder records ``failed: <stage>: interrupted`` as it does for Ctrl-C."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def run_cli(main: Callable[[list[str] | None], object], name: str, argv: Sequence[str] | None = None) -> None:
    """Run ``main(argv)`` as ``python -m experiments.<name>``: a :class:`ToolkitError` becomes one line, exit 2;
    Ctrl-C one line, exit 130; SIGTERM (:class:`Terminated`) one line, exit 143."""
    argv = list(sys.argv[1:] if argv is None else argv)
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        main(argv)
    except ToolkitError as err:
        if DEBUG_FLAG in argv:
            raise
        print(error_lines(f"python -m experiments.{name}", err), file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as err:
        if DEBUG_FLAG in argv:
            raise
        how = "terminated (SIGTERM)" if isinstance(err, Terminated) else "interrupted"
        print(f"python -m experiments.{name}: {how} (results.json records the stage it stopped in)", file=sys.stderr)
        sys.exit(143 if isinstance(err, Terminated) else 130)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------------------- flags from a config dataclass

Config = TypeVar("Config")
_METAVARS = {int: "N", float: "X", positive_int: "N", nonnegative_int: "N", positive_float: "X", fraction: "X",
             int_list: "K,K,...", figure_formats: "FORMATS"}


def option(default: Any, help: str, *, type: Callable[[str], Any] | None = None, choices: Sequence | None = None,
           nargs: str | None = None) -> Any:
    """A config field that is also a command-line flag: its default, help text and parse-time check (``type``).

    A tuple default (or ``nargs="+"``) becomes a flag taking several values; a ``False`` default a switch, a
    ``True`` default a ``--no-<name>`` switch that turns it off.
    """
    meta = {"help": help, "type": type, "choices": tuple(choices) if choices is not None else None, "nargs": nargs}
    return dataclasses.field(default=default, metadata=meta)


def override(config: type, name: str, default: Any, help: str | None = None) -> Any:
    """Field ``name`` of the settings record ``config`` with another default (and help text), its check kept.

    For a config that inherits a shared record but samples, say, fewer prompts::

        n_prompts: int = override(PromptSettings, "n_prompts", 32, "prompts (one template, one token length)")
    """
    fields = {f.name: f for f in dataclasses.fields(config)}
    if name not in fields:
        raise TypeError(f"override({config.__name__}, {name!r}, ...): {config.__name__} has no field {name!r}; its "
                        f"fields are {sorted(fields)}.")
    inherited = fields[name]
    return dataclasses.field(default=default, metadata={**inherited.metadata, **({"help": help} if help else {})})


def method_settings_flags(catalogue: dict, name: str) -> type:
    """A frozen dataclass mixin with one flag per parameter a catalogued method declares (``record.settings``).

    Field ``x`` of method ``m``'s settings becomes the flag ``--<m.prefix>-x`` (its help and choices read from the
    field's metadata, its parse check from the default's type), so a method added to a catalogue brings its flags
    with it and no config writes them out. :func:`method_settings_records` turns the parsed flags back into the
    methods' settings records.
    """
    parse = {bool: None, int: nonnegative_int, float: float, str: None}  # a settings record checks its own bounds
    fields = []
    for record in catalogue.values():
        for f in dataclasses.fields(record.settings) if record.settings is not None else ():
            meta = f.metadata
            fields.append((f"{record.prefix}_{f.name}", f.type,
                           option(f.default, meta.get("help", f.name), type=parse.get(type(f.default)),
                                  choices=meta.get("choices"))))
    return dataclasses.make_dataclass(name, fields, frozen=True)


def method_settings_records(config, catalogue: dict) -> tuple:
    """The settings record of every catalogued method that declares one, built from ``config``'s flags (the fields
    :func:`method_settings_flags` added)."""
    records = []
    for record in catalogue.values():
        if record.settings is not None:
            values = {f.name: getattr(config, f"{record.prefix}_{f.name}") for f in dataclasses.fields(record.settings)}
            records.append(record.settings(**values))
    return tuple(records)


def check_choices(config) -> None:
    """Raise :class:`circuits.errors.InputError` when a field declared with ``choices`` holds another value.

    The command line checks choices as it parses; this check also covers configs built in code.
    """
    from circuits.errors import InputError

    for f in dataclasses.fields(config):
        choices = f.metadata.get("choices")
        value = getattr(config, f.name)
        values = value if isinstance(value, tuple) else (value,)
        if choices and value is not None and any(v not in choices for v in values):
            raise InputError(f"{type(config).__name__}.{f.name} = {value!r}: choose from {', '.join(map(str, choices))}.")


def add_config_flags(parser: argparse.ArgumentParser, config: type, help_texts: dict[str, str] | None = None) -> None:
    """One ``--flag`` per field of the dataclass ``config`` that was declared with :func:`option`.

    ``help_texts`` replaces the help of inherited fields whose meaning this experiment narrows
    (e.g. ``out`` of a resumable experiment, whose default folder has no timestamp).
    """
    help_texts = help_texts or {}
    for f in dataclasses.fields(config):
        if "help" not in f.metadata:
            continue
        meta, flag = {**f.metadata, "help": help_texts.get(f.name, f.metadata["help"])}, "--" + f.name.replace("_", "-")
        if f.default is False:
            parser.add_argument(flag, action="store_true", help=meta["help"])
            continue
        if f.default is True:  # on by default: the flag turns it off (a value after the flag would be a string)
            parser.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false",
                                help=f"turn off: {meta['help']}")
            continue
        several = isinstance(f.default, tuple) or meta["nargs"] is not None
        sample = f.default[0] if isinstance(f.default, tuple) and f.default else f.default
        kind = meta["type"] or (type(sample) if isinstance(sample, (int, float)) and not isinstance(sample, bool) else str)
        metavar = ("NAME" if several else None) if meta["choices"] else _METAVARS.get(kind)
        parser.add_argument(flag, type=kind, default=f.default, choices=meta["choices"], metavar=metavar,
                            nargs=(meta["nargs"] or "+") if several else None, help=meta["help"])


def config_parser(config: type, name: str, doc: str | None, help_texts: dict[str, str] | None = None) -> ExperimentParser:
    """The parser of ``python -m experiments.<name>``: one flag per field of the dataclass ``config``."""
    parser = make_parser(name, doc)
    add_config_flags(parser, config, help_texts)
    return parser


def parse_config(parser: argparse.ArgumentParser, config: type[Config], argv: Sequence[str] | None = None,
                 **fixed: Any) -> Config:
    """Parse ``argv`` (default: ``sys.argv``) with ``parser`` into ``config``; several-valued flags become tuples.

    ``fixed`` fields are set by the caller, not by a flag.
    """
    args = vars(parser.parse_args(argv))
    args.pop("debug", None)
    return config(**{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}, **fixed)


def no_grad(stages: Callable[..., Any]) -> Callable[..., Any]:
    """``@torch.no_grad()`` for an experiment's stages, importing torch when they run, not when the module loads.

    An experiment module imports nothing heavy at its top, so ``--help`` and flag errors answer before torch loads.
    """

    @wraps(stages)
    def without_gradients(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            return stages(*args, **kwargs)

    return without_gradients
