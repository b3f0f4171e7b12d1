"""Where a command writes its JSON record, so that a result is never lost or half-written.

`ResultFile.prepare` checks the path before the run (a bad one fails in a second, not after it); `write` puts
the record in a temporary file beside the target and renames it over the target, so a reader, a crash or a
Ctrl-C never sees half a record; if the write fails anyway (a full disk, /dev/full), it says so in one line and
prints the record to stdout instead. A target that is not a regular file (a device, a pipe) is written in place:
a rename would replace the device node.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path


class ResultFile:
    """The JSON output of a command: path ("-": stdout), option: the flag that named it, for the messages."""

    def __init__(self, path: str | os.PathLike, option: str = "--json"):
        self.path, self.option = Path(path), option
        self.to_stdout = str(path) == "-"

    def _temporary(self) -> Path:
        return self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")

    def _in_place(self) -> bool:
        """Whether the target exists and is not a regular file (written in place, not renamed over)."""
        try:
            return not stat.S_ISREG(self.path.stat().st_mode)
        except FileNotFoundError:
            return False

    def prepare(self) -> ResultFile:
        """Check before the run that the record can be written: ValueError naming the option otherwise. Creates
        (and removes again) the temporary file the record will be written to."""
        if self.to_stdout:
            return self
        where = f"{self.option} {self.path}"
        if self.path.is_dir():
            raise ValueError(f"{where} is a folder; give a file path (or '-' for stdout)")
        if not self.path.parent.is_dir():
            raise ValueError(f"{where}: the folder {self.path.parent} does not exist")
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise ValueError(f"{where} is not writable")
        if self._in_place():
            return self
        tmp = self._temporary()
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            tmp.unlink()
        except OSError as e:
            raise ValueError(f"{where}: cannot create a file in {self.path.parent} ({e.strerror})") from e
        return self

    def write(self, record: dict, indent: int | None = 2, default=None) -> bool:
        """Write the record (atomically where the target is a regular file or new). On failure: one line on stderr,
        the record on stdout, and False. default: json's, for values it cannot encode."""
        if self.to_stdout:  # one line: stdout carries the record alone
            sys.stdout.write(json.dumps(record, default=default) + "\n")
            sys.stdout.flush()
            return True
        text = json.dumps(record, indent=indent, default=default) + "\n"
        try:
            if self._in_place():
                with open(self.path, "w") as f:
                    f.write(text)
            else:
                self._write_atomically(text)
            return True
        except OSError as e:
            print(f"hyquant: error: could not write {self.option} {self.path} ({e.strerror or e}); the record "
                  f"follows on stdout", file=sys.stderr)
            sys.stdout.write(json.dumps(record, default=default) + "\n")
            sys.stdout.flush()
            return False

    def _write_atomically(self, text: str) -> None:
        tmp = self._temporary()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            if self.path.exists():  # keep an existing file's permissions
                os.chmod(tmp, stat.S_IMODE(self.path.stat().st_mode))
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
