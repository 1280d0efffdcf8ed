"""Files a user names, opened as that user would, or not at all.

The standalone service may run with more rights than the users whose files it reads (a job's
log, in the working directory its user chose). It opens such a file only with `open_owned`:

- every component of the path is opened in turn, from `/` (or from a root the admin named),
  with no symbolic link followed (O_NOFOLLOW, dir_fd) and without blocking (O_NONBLOCK), so a
  link, a FIFO or a device on the way is refused and never stalls the opener;
- the file must be a regular file (fstat) with a single link (a hard link to someone else's
  file is refused) owned by the user's account (`owner_uid`);
- it is read in a small pool of threads of its own (`read_at`), never on the IOLoop, and never
  past the size it had when it was opened.

The runner and the user's server read their own files (they run as the user) with
`read_regular`: links followed as the user's own open would, but a regular file only, read
without blocking on a FIFO and never past its size when opened.

Imports only the standard library, so the client and the kernel's magics can use it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import pwd
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

# The threads that open and read users' files: a file system that hangs holds these, not the IOLoop
# nor the default executor the rest of the process shares.
FILE_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpualloc-user-files")
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Refused(Exception):
    """The file is not one its user may have read this way; the message says why, in a few words."""


def local_account(user: str) -> pwd.struct_passwd | None:
    """The local account named `user` in the system's account database, or None."""
    try:
        return pwd.getpwnam(user)
    except (KeyError, ValueError):  # no such account; a name pwd cannot take (a NUL)
        return None


def owner_uid(user: str) -> int:
    """Who must own a file served as `user`'s: the uid of `user`'s local account; for a user
    without one (a token's user, a hub user the system does not know, such as the demo's alice and
    bob) the service's own account, the only one such a user's server can run as without an
    account of its own. A user whose server runs as another account gets nothing served."""
    account = local_account(user)
    return account.pw_uid if account is not None else os.geteuid()


def workdir_roots(user: str, templates: Sequence[str]) -> list[str] | None:
    """The directories `user`'s job working directories must lie in (`{home}`: the home of
    `user`'s local account, `{user}`: the name), or None when `user` is not confined: no
    templates, no local account (no home to confine to), or the service's own account (which
    reads all the service can)."""
    account = local_account(user)
    if not templates or account is None or account.pw_uid == os.geteuid():
        return None
    expanded = (t.replace("{home}", account.pw_dir).replace("{user}", user) for t in templates)
    return [posixpath.normpath(root) for root in expanded if root.startswith("/")]


def root_of(path: str, roots: Sequence[str]) -> str | None:
    """The longest of `roots` that the normalised absolute `path` lies in (or is), else None."""
    inside = [r for r in roots if path == r or path.startswith(r.rstrip("/") + "/")]
    return max(inside, key=len, default=None)


def open_owned(path: str, uid: int, trusted: str = "/") -> tuple[int, int]:
    """(descriptor, size) of the regular file at `path` (normalised, absolute) owned by `uid`.

    The components below `trusted` (a directory the admin named, itself opened as the system
    resolves it) are opened one by one without following links. FileNotFoundError when a
    component is missing; Refused when the path or the file breaks a rule. The caller closes it."""
    if root_of(path, [trusted]) is None:
        raise Refused("it lies outside the directories its user's files may be in")
    parts = [p for p in path[len(trusted.rstrip("/")):].split("/") if p]
    if not parts:
        raise Refused("it is a directory")
    folder = os.open(trusted, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            try:
                inner = os.open(name, _DIRECTORY, dir_fd=folder)
            except OSError as err:
                if err.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise Refused(f"{name} on its path is {_kind(name, folder)}, not a directory") from None
                raise
            os.close(folder)
            folder = inner
        name = parts[-1]
        kind = _kind(name, folder)  # refused before it is opened: no device is ever opened
        if kind != "a regular file":
            raise Refused(f"it is {kind}, not a regular file")
        try:
            fd = os.open(name, _FILE, dir_fd=folder)
        except OSError as err:
            if err.errno == errno.ELOOP:  # made a link since
                raise Refused("it is a symbolic link, not a regular file") from None
            raise
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"it is {_kind_of(info.st_mode)}, not a regular file")
        if info.st_uid != uid:
            raise Refused("it is not owned by its user")
        if info.st_nlink != 1:
            raise Refused("it has other hard links")
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def read_regular(path: str, offset: int = 0) -> bytes:
    """The bytes of the regular file at `path` from `offset` to its size when opened (links
    followed, as its user's own open would); Refused for anything but a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{path} is {_kind_of(info.st_mode)}, not a regular file")
        chunks, end = [], info.st_size
        while offset < end and (chunk := os.pread(fd, end - offset, offset)):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


async def read_at(fd: int, offset: int, size: int) -> bytes:
    """Up to `size` bytes of `fd` at `offset`, read in FILE_THREADS (b"" at its end)."""
    return await asyncio.get_running_loop().run_in_executor(FILE_THREADS, os.pread, fd, size, offset)


async def opened_owned(path: str, uid: int, trusted: str = "/") -> tuple[int, int]:
    """`open_owned` in FILE_THREADS."""
    return await asyncio.get_running_loop().run_in_executor(FILE_THREADS, open_owned, path, uid, trusted)


def _kind(name: str, folder: int) -> str:
    return _kind_of(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)


def _kind_of(mode: int) -> str:
    kinds = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((text for test, text in kinds if test(mode)), "not a file")
