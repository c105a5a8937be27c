"""Say which line of a data file is wrong, when ``datasets`` only says that something is.

``datasets.load_dataset`` reports a broken file as ``DatasetGenerationError: An error occurred while
generating the dataset`` with the parser's error as its cause (``pyarrow``'s ``JSON parse error ... in row
56`` counts rows of one read block, not lines of the file), a non-UTF-8 byte as a ``UnicodeDecodeError`` at an
offset of an internal buffer, and an empty file as a bare ``StopIteration``. On that error path only, the file
is read again line by line to find the culprit, so the message can say ``line 57`` and show the line.

Rows and lines: the ``json`` builder skips blank lines of a JSON Lines file, so source row ``r`` (0-based) is
the ``r + 1``-th non-blank line (:func:`jsonl_line_of_row`).
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from hf_lightning.core.errors import DataError

EXCERPT = 80


def _root_cause(err: BaseException) -> BaseException:
    """The innermost exception of a ``raise ... from`` / implicit-context chain."""
    seen = {id(err)}
    while True:
        nxt = err.__cause__ or err.__context__
        if nxt is None or id(nxt) in seen:
            return err
        seen.add(id(nxt))
        err = nxt


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _excerpt(text: str) -> str:
    text = text.rstrip("\r\n")
    return repr(text if len(text) <= EXCERPT else text[:EXCERPT] + "...")


def first_non_utf8_line(path: str) -> tuple[int, int, int, bytes] | None:
    """``(line number, column, offending byte, raw line)`` of the first line that is not UTF-8, else ``None``.

    Line and column are 1-based; the column counts bytes.
    """
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return number, err.start + 1, raw[err.start], raw
    return None


def first_bad_json_line(path: str) -> tuple[int, str, str] | None:
    """``(line number, parser message, line excerpt)`` of the first non-blank line of a JSON Lines file that
    is not one JSON object, else ``None``."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as err:
                return number, f"{err.msg}: column {err.colno}", _excerpt(line)
            if not isinstance(value, dict):
                return number, f"a JSON {type(value).__name__}, not an object", _excerpt(line)
    return None


def jsonl_line_of_row(path: str, row: int) -> int | None:
    """The 1-based line of a JSON Lines file that holds source row ``row`` (blank lines are not rows)."""
    seen = -1
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if raw.strip():
                seen += 1
                if seen == row:
                    return number
    return None


def csv_line_of_row(path: str, row: int) -> int | None:
    """The 1-based line of a CSV file where data row ``row`` (0-based, the header not counted) starts.

    Read as ``pandas.read_csv`` reads by default (the ``datasets`` csv builder): comma-separated, double
    quotes (a quoted field may span lines), blank lines skipped.
    """
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.reader(fh)
        seen, start = -2, 1  # -2: the header is not a data row
        for record in reader:
            if record:
                seen += 1
                if seen == row:
                    return start
            start = reader.line_num + 1
    return None


def is_json_lines(path: str) -> bool:
    """Whether ``path`` is read line by line by the ``json`` builder (``.jsonl``, or ``.json`` not starting
    with ``[``/``{`` spanning lines). A ``.json`` file holding one array or object is not."""
    if path.lower().endswith(".jsonl"):
        return True
    with open(path, "rb") as fh:
        head = fh.read(4096).lstrip()
    if head.startswith(b"["):
        return False
    first = head.split(b"\n", 1)[0]
    try:
        json.loads(first)
    except ValueError:
        return False
    return True


def non_utf8_message(path: str) -> str | None:
    """``line N is not UTF-8 text (byte 0x.. at column C: ...); re-encode ...`` for a file, else ``None``."""
    bad = first_non_utf8_line(path)
    if bad is None:
        return None
    line, column, byte, raw = bad
    return (
        f"line {line} is not UTF-8 text (byte 0x{byte:02x} at column {column}: "
        f"{_excerpt(raw.decode('utf-8', errors='replace'))}); re-encode the file as UTF-8, e.g. "
        f"iconv -f latin1 -t utf-8 {os.path.basename(path)}"
    )


def non_utf8_error(path: Any, split: str, err: UnicodeDecodeError) -> DataError:
    """A :class:`DataError` naming the file line for a ``UnicodeDecodeError`` raised while reading rows
    (pyarrow may load bad bytes and fail only when they are decoded)."""
    detail = None
    if isinstance(path, (str, os.PathLike)) and os.path.isfile(path):
        detail = non_utf8_message(os.fspath(path))
    return DataError(f"data.path={path} ({split}): {detail or f'text that is not UTF-8 ({err})'}")


def explain_load_error(path: str, builder: str, err: BaseException) -> str:
    """One sentence (after ``data.path=PATH:``) saying why ``datasets`` could not read ``path``.

    In order: an empty file; no rows at all; a non-UTF-8 byte (line, column, byte, and the fix); for JSON
    Lines, the first line that is not a JSON object; otherwise the parser's own message (``pandas`` names the
    CSV line).
    """
    if os.path.getsize(path) == 0:
        return "the file is empty (0 bytes): no rows to train on"
    causes = list(_chain(err))
    if any(isinstance(e, UnicodeDecodeError) for e in causes) or any(
        "Invalid encoding" in str(e) for e in causes
    ):
        message = non_utf8_message(path)
        if message is not None:
            return message
    if builder == "json" and is_json_lines(path):
        bad_json = first_bad_json_line(path)
        if bad_json is not None:
            line, message, excerpt = bad_json
            return f"could not be read as json: line {line} is not a JSON object ({message}): {excerpt}"
    root = _root_cause(err)
    message = str(root) or type(root).__name__
    if "corresponds to no data" in message or isinstance(root, StopIteration):
        return "the file holds no rows (only a header, an empty list, or blank lines)"
    return f"could not be read as {builder}: {message.strip()}"


#: the ``datasets`` file readers that log a parse failure at ERROR before they raise it
READER_LOGGERS = (
    "datasets.packaged_modules.json.json",
    "datasets.packaged_modules.csv.csv",
    "datasets.packaged_modules.parquet.parquet",
)


class _DropReadFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and record.getMessage().startswith("Failed to "))


_DROP = _DropReadFailures()


def drop_reader_error_logs() -> None:
    """Drop the ``Failed to load JSON from file ...`` / ``Failed to read file ...`` ERROR records of
    ``datasets``' readers (:data:`READER_LOGGERS`; idempotent).

    Each is logged just before the reader raises the same exception, which :func:`explain_load_error` turns
    into one message naming the line; the records printed the parser's wording (``in row 56`` of a read
    block) twice before that message.
    """
    for name in READER_LOGGERS:
        logger = logging.getLogger(name)
        if _DROP not in logger.filters:
            logger.addFilter(_DROP)


def read_error(name: Any, split: str, err: BaseException) -> DataError:
    """The :class:`DataError` for an exception raised while a stream reads its source ``name``
    (``data.path``)."""
    if isinstance(name, (str, os.PathLike)) and os.path.isfile(name):
        path = os.fspath(name)
        builder = {".csv": "csv", ".parquet": "parquet"}.get(os.path.splitext(path)[1].lower(), "json")
        return DataError(f"data.path={path}: {explain_load_error(path, builder, err)}")
    where = f"data.path={name}" if name is not None else "the stream"
    return DataError(f"{where} ({split} stream): could not be read ({type(err).__name__}: {err})")
