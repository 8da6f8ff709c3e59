"""Extracting archives someone else made (an agent's workspace, a downloaded sdist).

``safe_extract`` keeps every member inside the destination: a leading ``/`` is stripped,
``..`` that leaves it is refused, links that point outside are refused or skipped,
devices and FIFOs are refused, and modes lose setuid/setgid/sticky and group/other write
bits with no ownership applied. That is what Python's ``data`` extraction filter (PEP 706) does;
interpreters without it (Python 3.11.0-3.11.3, e.g. Debian 12's 3.11.2) get the same
checks from ``_extract_checked``, member by member at extraction time, so a link made by
an earlier member is seen when a later member is checked.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path


def safe_extract(
    tar: tarfile.TarFile, dest: str | os.PathLike, *, skip_escaping_links: bool
) -> None:
    """Extract ``tar`` into ``dest``; ``skip_escaping_links`` drops links that point
    outside (a copied venv's ``python``) instead of refusing the archive."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter=_skip_escaping_links if skip_escaping_links else "data")
    else:
        _extract_checked(tar, dest, skip_escaping_links=skip_escaping_links)


def _skip_escaping_links(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    try:
        return tarfile.data_filter(member, dest)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        return None


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _extract_checked(tar: tarfile.TarFile, dest, *, skip_escaping_links: bool) -> None:
    os.makedirs(dest, exist_ok=True)
    root = os.path.realpath(dest)
    for member in tar.getmembers():
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise tarfile.TarError(f"{member.name!r} is a special file")
        name = member.name = member.name.lstrip("/" + os.sep)  # absolute: under dest
        if not _inside(root, os.path.realpath(os.path.join(root, name))):
            raise tarfile.TarError(f"{member.name!r} would land outside {root}")
        if member.issym() or member.islnk():
            base = os.path.dirname(name) if member.issym() else ""
            target = os.path.realpath(os.path.join(root, base, member.linkname))
            if os.path.isabs(member.linkname) or not _inside(root, target):
                if skip_escaping_links:
                    continue
                raise tarfile.TarError(f"link {member.name!r} -> {member.linkname!r} leaves {root}")
        if member.isfile() or member.islnk():
            member.mode = (member.mode | 0o600) & (0o755 if member.mode & 0o100 else 0o644)
        else:
            member.mode &= 0o755
        member.uid, member.gid = os.getuid(), os.getgid()
        member.uname = member.gname = ""
        tar.extract(member, root, set_attrs=not member.issym())


def publish(staged: Path, final: Path) -> None:
    """Rename a fully built cache folder to its final name. The name is a digest of the
    content, so when a concurrent build of the same content got there first, theirs stays."""
    try:
        staged.rename(final)
    except OSError:
        if not final.is_dir():
            raise
