"""User-facing errors: one clear message naming file, row, column and rule."""

from __future__ import annotations


class ClapError(Exception):
    """An error caused by input or configuration, reported without a traceback.

    Args:
        message: what is wrong and what to do about it.
        file: the file the problem is in, if any.
        row: 1-based row/line number in that file, if any.
        column: the column or field, if any.
        rule: a short machine-readable rule name (e.g. ``missing_column``).
    """

    def __init__(self, message: str, *, file=None, row=None, column=None, rule: str | None = None):
        self.file, self.row, self.column, self.rule = file, row, column, rule
        super().__init__(message)

    def __str__(self) -> str:
        where = []
        if self.file is not None:
            where.append(f"file {self.file}")
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column {self.column!r}")
        if self.rule:
            where.append(f"rule {self.rule}")
        prefix = f"[{', '.join(where)}] " if where else ""
        return prefix + super().__str__()
