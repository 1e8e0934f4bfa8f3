"""One writer per (dump directory, rank): a lock file that refuses a second process.

Two processes dumping the same rank into one directory would interleave their records in one
``records.jsonl`` and overwrite each other's tensor files. The first one takes
``<dump>/.rank<R>.lock`` (an ``fcntl.flock``, released by the kernel when the process ends, so
a killed process never blocks the next run; the file holds the owner's pid and host for the
message). Where ``fcntl`` is missing (Windows) an ``O_EXCL`` file with the pid is used, and a lock
whose pid is no longer running on this host is taken over.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from ..errors import UsageError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def lock_path(root: Path, rank: int) -> Path:
    """The lock file of ``rank`` in dump directory ``root``."""
    return root / f".rank{int(rank)}.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    except OSError:
        return False
    return True


def _owner(path: Path) -> tuple[int | None, str]:
    """(pid, host) written in a lock file, (None, "") when unreadable."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").split()
        return int(text[0]), (text[1] if len(text) > 1 else "")
    except (OSError, ValueError, IndexError):
        return None, ""


def _refuse(root: Path, rank: int, path: Path) -> UsageError:
    pid, host = _owner(path)
    who = f"process {pid}" + (f" on {host}" if host and host != socket.gethostname() else "") if pid else "another process"
    return UsageError(
        f"dump directory {root} is in use: {who} is dumping rank {rank} into it; give this run another "
        f"output directory, or wait until that process ends (ranks of one job: start the dump after "
        f"init_process_group, or set RANK, so that each takes its own rank)"
    )


class DumpLock:
    """Held while a :class:`~torchparity.dump.writer.DumpWriter` writes one rank of a dump."""

    def __init__(self, root: Path, rank: int) -> None:
        self.root, self.rank = Path(root), int(rank)
        self.path = lock_path(self.root, self.rank)
        self._fd: int | None = None

    def acquire(self) -> "DumpLock":
        """Take the lock or raise :class:`UsageError` naming the process that holds it."""
        if fcntl is None:  # pragma: no cover - Windows
            self._acquire_excl()
        else:
            self._acquire_flock()
        return self

    def _acquire_flock(self) -> None:
        for _ in range(10):  # the holder may remove the file between our open and flock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise _refuse(self.root, self.rank, self.path) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except OSError:
                same = False
            if not same:  # locked a file its owner just removed: try again on the new one
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            self._fd = fd
            return
        raise _refuse(self.root, self.rank, self.path)  # pragma: no cover - pathological contention

    def _acquire_excl(self) -> None:  # pragma: no cover - Windows
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                pid, host = _owner(self.path)
                if pid is not None and (host not in ("", socket.gethostname()) or _pid_alive(pid)):
                    raise _refuse(self.root, self.rank, self.path) from None
                try:  # stale: its process is gone
                    self.path.unlink()
                except OSError:
                    pass
                continue
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            self._fd = fd
            return
        raise _refuse(self.root, self.rank, self.path)

    def release(self) -> None:
        """Remove the lock file and let go (idempotent)."""
        if self._fd is None:
            return
        try:
            self.path.unlink()
        except OSError:
            pass
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = None

    def __enter__(self) -> "DumpLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
