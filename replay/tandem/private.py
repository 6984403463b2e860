"""What tandem writes is private: directories 0700, files 0600, whatever the umask.

A recording holds a guest's disk writes, network traffic and console, and an analysis
workdir holds its findings and the analyses' own recordings; bundles travel (to a farm,
to a colleague, into a bug report). Under the usual umask 022 a plain mkdir/open makes
them 0755/0644, readable by every user of the machine, so every directory and file
tandem creates for a bundle or a workdir goes through here. QEMU's own logs are
opened 0600 by the patches (qemu-patches/0012, 0015); the QEMUs and qemu-imgs tandem starts
itself also run under umask 077 (CHILD_UMASK), for whatever else they create.
"""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from .errors import TandemError

DIR_MODE = 0o700
FILE_MODE = 0o600
CHILD_UMASK = 0o077     # subprocess's umask= for the QEMUs and qemu-imgs tandem starts


def make_dir(path: str | os.PathLike[str]) -> Path:
    """Create path and its missing parents 0700; an existing path is left as it is.

    Parents too: `tandem record out/x.tdm` creating out/ makes a directory as private as
    the bundle in it. mkdir's mode is masked by the umask, hence the chmod."""
    p = Path(path)
    missing = []
    for d in (p, *p.parents):
        if d.exists():
            break
        missing.append(d)
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            if not d.is_dir():
                raise
            continue        # made meanwhile by someone else: theirs, left as it is
        os.chmod(d, DIR_MODE)
    return p


def require_private_dir(d: str | os.PathLike[str], what: str) -> None:
    """Raise unless directory d is this user's and closed to group and others: where a
    unix socket that steers a VM goes (a feed, a gate, QMP). A socket file's own mode is
    not honoured everywhere and the first client to connect to a listener wins; only the
    directory keeps other users from connecting, or from replacing the socket."""
    st = os.stat(d)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise TandemError(f"{what}: its directory {d} is open to other users "
                          f"(mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}); "
                          f"tandem puts its sockets only in a 0700 directory of its own")


def opener(path: str, flags: int) -> int:
    """open()'s opener= for a private file: created 0600, and an existing file the caller
    rewrites (a workdir's findings.jsonl from an earlier run) made 0600 too."""
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with open(path, "w", encoding="utf-8", opener=opener) as f:
        f.write(text)


def copy_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """shutil.copyfile, but dst is 0600 from its first byte (copyfile makes it 0644)."""
    with open(src, "rb") as fin, open(dst, "wb", opener=opener) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def exposed(path: str | os.PathLike[str]) -> list[tuple[Path, int]]:
    """(path, mode) of path and everything under it that group or others may read or
    write; symlinks are not followed (their own mode means nothing). Search (x) alone is
    not counted: through a 0711 directory only files that are readable themselves leak,
    and those are listed."""
    root = Path(path)
    found = [root]
    if root.is_dir() and not root.is_symlink():
        for top, dirs, files in os.walk(root):      # followlinks=False: no walking out
            found += [Path(top, n) for n in sorted(dirs + files)]
    out = []
    for p in found:
        try:
            st = p.lstat()
        except FileNotFoundError:   # a live bundle's manifest.json.tmp, renamed meanwhile
            continue
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o066:
            out.append((p, stat.S_IMODE(st.st_mode)))
    return out
