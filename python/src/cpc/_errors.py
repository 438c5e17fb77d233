"""Exceptions and diagnostics.

Every failure of libcpc comes back as a status chain (include/cpc/status.h); it is
turned into a Python exception here, never an abort of the interpreter.

    cpc.Error                      base: .code ("plan", "usage", ...), .rule (11 for
    |                              CP011, 0 when none), .message, .hint, .diagnostics
    +-- cpc.PlanError              a plan rejected by a rule (CP codes)
    +-- cpc.UsageError             wrong argument: shape, stride, dtype, rank (also a
    |                              ValueError); cpc.InputError (bad tensors/artifact)
    +-- cpc.FileError              unreadable / unwritable file (also an OSError)
    +-- cpc.RuntimeError           a rank, the transport or the device failed
        +-- cpc.UnsupportedError   not available in this build or on this machine
"""

import builtins
import re


class Diagnostic:
    """One diagnostic, with the fields of SPEC section 3's JSON: severity ("error",
    "warning", "note"), code ("CP011" or None), message, file, line, column (1-based;
    None when unknown) and hint (or None)."""

    __slots__ = ("severity", "code", "message", "file", "line", "column", "hint")

    def __init__(self, severity, code, message, file=None, line=None, column=None, hint=None):
        self.severity, self.code, self.message = severity, code, message
        self.file, self.line, self.column, self.hint = file, line, column, hint

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __str__(self):
        where = ""
        if self.file:
            where = f"{self.file}:{self.line or 0}:{self.column or 0}: "
        code = f"[{self.code}]" if self.code else ""
        hint = f"; hint: {self.hint}" if self.hint else ""
        return f"{where}{self.severity}{code}: {self.message}{hint}"

    def __repr__(self):
        return f"Diagnostic({self.as_dict()!r})"

    def __eq__(self, other):
        return isinstance(other, Diagnostic) and self.as_dict() == other.as_dict()


class Error(Exception):
    """Base of cpc's exceptions.  .code is libcpc's error class name, .rule the CP rule
    number (0 when none), .diagnostics every diagnostic of the failure (the first is
    the error itself for a single failure)."""

    def __init__(self, message, code="internal", rule=0, hint=None, diagnostics=()):
        super().__init__(message)
        self.message, self.code, self.rule, self.hint = message, code, rule, hint
        self.diagnostics = list(diagnostics)

    def __str__(self):
        # the message, then the hint as cpc prints it (a traceback shows str(e): a hint
        # kept only in .hint would never reach a user who does not catch the error)
        if self.hint and self.hint not in self.message:
            return f"{self.message}; hint: {self.hint}"
        return self.message


class PlanError(Error):
    """A plan rejected by one or more rules; .diagnostics holds every violation (with
    positions and hints) and the warnings."""

    def __str__(self):
        errs = [str(d) for d in self.diagnostics if d.severity == "error"]
        return "\n".join(errs) if errs else self.message


class UsageError(Error, ValueError):
    """A wrong argument: shape, stride, dtype, rank or option."""


class InputError(UsageError):
    """Bad input tensors or a malformed / tampered artifact."""


class FileError(Error, OSError):
    """An unreadable or unwritable file."""

    def __str__(self):
        return Error.__str__(self)  # not OSError's "[Errno ...]" form


class RuntimeError(Error, builtins.RuntimeError):  # noqa: A001 - cpc.RuntimeError by SPEC
    """A rank, the transport or the device failed (the message names the rank and op)."""


class UnsupportedError(RuntimeError):
    """Not available in this build or on this machine (MPI, CUDA, NCCL, libcpc itself)."""


class NoMemoryError(RuntimeError, MemoryError):
    """Out of host memory."""


CLASSES = {"plan": PlanError, "check": Error, "usage": UsageError, "io": FileError,
           "input": InputError, "nomem": NoMemoryError, "internal": RuntimeError,
           "runtime": RuntimeError, "unsupported": UnsupportedError}


def _s(b):
    return None if b is None else b.decode("utf-8", "replace")


def _diagnostic(L, st):
    import ctypes
    from ._native import SEVERITIES
    f = ctypes.c_char_p()
    line = ctypes.c_int()
    col = ctypes.c_int()
    L.cpc_status_position(st, ctypes.byref(f), ctypes.byref(line), ctypes.byref(col))
    rule = L.cpc_status_rule(st)
    sev = L.cpc_status_severity(st)
    return Diagnostic(SEVERITIES[sev] if 0 <= sev < len(SEVERITIES) else "error",
                      f"CP{rule:03d}" if rule else None,
                      _s(L.cpc_status_message(st)) or "",
                      _s(f.value), line.value or None, col.value or None,
                      _s(L.cpc_status_hint(st)))


def diagnostics_of(L, st):
    """The chain `st` (a status pointer) as a list of Diagnostic, each followed by its
    notes (cpc_status_notes; as `cpc --format json` lists them)."""
    out = []
    while st:
        out.append(_diagnostic(L, st))
        note = L.cpc_status_notes(st)
        while note:
            out.append(_diagnostic(L, note))
            note = L.cpc_status_next(note)
        st = L.cpc_status_next(st)
    return out


def take_status(L, st, extra=()):
    """Frees the status `st`; returns the exception it stands for (None for OK)."""
    if not st:
        return None
    from ._native import CODE_NAMES
    try:
        code = L.cpc_status_code(st)
        name = CODE_NAMES[code] if 0 <= code < len(CODE_NAMES) else "internal"
        diags = diagnostics_of(L, st)
    finally:
        L.cpc_status_free(st)
    first = diags[0] if diags else Diagnostic("error", None, "unknown error")
    cls = CLASSES.get(name, Error)
    rule = int(first.code[2:]) if first.code else 0
    msg = first.message if name != "plan" else "\n".join(str(d) for d in diags)
    return cls(msg, code=name, rule=rule, hint=first.hint, diagnostics=list(diags) + list(extra))


def check(L, st, extra=()):
    """Raises the exception of status `st` (frees it); returns None for OK."""
    e = take_status(L, st, extra)
    if e is not None:
        raise e
