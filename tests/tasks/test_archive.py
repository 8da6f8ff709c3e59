"""safe_extract on hostile archives, through both paths: Python's data filter where the
interpreter has it, and the member-by-member checks used where it does not (Python
3.11.0-3.11.3, e.g. Debian 12's 3.11.2, whose extractall takes no ``filter``)."""

from __future__ import annotations

import io
import os
import stat
import tarfile

import pytest

from gyre_env.tasks import archive


def _archive(*members) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, extra in members:
            info = tarfile.TarInfo(name)
            data = b""
            if kind == "file":
                data = extra.get("data", b"x")
                info.size, info.mode = len(data), extra.get("mode", 0o644)
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind in ("sym", "hard"):
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = extra["to"]
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
    buf.seek(0)
    return tarfile.open(fileobj=buf, mode="r")


@pytest.fixture(params=["data_filter", "checked"])
def extract(request, monkeypatch):
    if request.param == "checked":  # an interpreter without PEP 706's filters
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this interpreter has no tarfile.data_filter")
    return archive.safe_extract


def test_ordinary_trees_come_out_whole(extract, tmp_path):
    tar = _archive(
        ("pkg", "dir", {}),
        ("pkg/a.py", "file", {"data": b"print(1)\n"}),
        ("pkg/run.sh", "file", {"data": b"#!/bin/sh\n", "mode": 0o4777}),
        ("pkg/link.py", "sym", {"to": "a.py"}),
        ("pkg/hard.py", "hard", {"to": "pkg/a.py"}),
        ("/abs/b.py", "file", {}),  # a leading / is stripped: it lands under dest
    )
    extract(tar, tmp_path, skip_escaping_links=False)
    assert (tmp_path / "pkg/a.py").read_bytes() == b"print(1)\n"
    assert (tmp_path / "pkg/link.py").read_bytes() == b"print(1)\n"
    assert (tmp_path / "pkg/hard.py").read_bytes() == b"print(1)\n"
    mode = stat.S_IMODE(os.stat(tmp_path / "pkg/run.sh").st_mode)
    assert mode & 0o100 and not mode & (stat.S_ISUID | stat.S_IWGRP | stat.S_IWOTH)
    assert (tmp_path / "abs/b.py").exists()
    with pytest.raises(tarfile.TarError, match="special file"):
        extract(_archive(("pipe", "fifo", {})), tmp_path / "d", skip_escaping_links=False)


@pytest.mark.parametrize(
    "member",
    [
        ("../evil", "file", {}),
        ("a/../../evil", "file", {}),
        ("out", "sym", {"to": "/etc/passwd"}),
        ("out", "sym", {"to": "../../etc"}),
        ("out", "hard", {"to": "../outside"}),
    ],
)
def test_paths_and_links_leaving_the_destination_are_refused(extract, tmp_path, member):
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(tarfile.TarError):
        extract(_archive(member), dest, skip_escaping_links=False)
    assert not (tmp_path / "evil").exists() and not (tmp_path / "outside").exists()


def test_escaping_links_can_be_skipped_instead(extract, tmp_path):
    tar = _archive(
        ("venv/bin/python", "sym", {"to": "/usr/bin/python3"}),
        ("up", "sym", {"to": "../.."}),
        ("ok.txt", "file", {}),
    )
    extract(tar, tmp_path, skip_escaping_links=True)
    assert (tmp_path / "ok.txt").exists()
    assert not os.path.lexists(tmp_path / "venv/bin/python")
    assert not os.path.lexists(tmp_path / "up")
    with pytest.raises(tarfile.TarError):  # a path escaping by name is still refused
        extract(_archive(("../evil", "file", {})), tmp_path / "d", skip_escaping_links=True)
