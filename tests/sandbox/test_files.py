"""File APIs: paths are resolved inside the sandbox and refused outside the workspace."""

from __future__ import annotations

import base64
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from gyre_env.sandbox import PathOutsideWorkspaceError, SandboxError

pytestmark = pytest.mark.timeout(90)

ESCAPES = ["../escaped.txt", "sub/../../escaped.txt", "/tmp/escaped.txt", "/etc/passwd", "/"]


def _plant_links(sandbox) -> None:
    """Symlinks an agent could leave in its workspace, pointing out of it."""
    result = sandbox.exec(
        "mkdir -p sub && ln -s / root_link && ln -s /etc/passwd passwd_link "
        "&& ln -s ../../../../../tmp sub/tmp_link && ln -s /tmp/escaped.txt dangling_link"
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("path", ESCAPES)
def test_paths_outside_the_workspace_are_refused(make, any_backend, path):
    sandbox = make(any_backend)
    with pytest.raises(PathOutsideWorkspaceError, match="outside the workspace") as info:
        sandbox.write_file(path, "owned")
    assert repr(path) in str(info.value)
    with pytest.raises(PathOutsideWorkspaceError, match="outside the workspace"):
        sandbox.read_file(path)
    with pytest.raises(PathOutsideWorkspaceError):
        sandbox.get_dir(path, "/nonexistent-gyre-target")
    assert sandbox.exec("test -e /tmp/escaped.txt").exit_code == 1


def test_symlinks_out_of_the_workspace_are_refused(make, any_backend, tmp_path):
    sandbox = make(any_backend)
    _plant_links(sandbox)
    for path in ("root_link/etc/passwd", "passwd_link", "sub/tmp_link/escaped.txt"):
        with pytest.raises(PathOutsideWorkspaceError, match="outside the workspace"):
            sandbox.read_file(path)
    for path in ("root_link/tmp/escaped.txt", "dangling_link", "sub/tmp_link/escaped.txt"):
        with pytest.raises(PathOutsideWorkspaceError, match="outside the workspace"):
            sandbox.write_file(path, "owned")
    with pytest.raises(PathOutsideWorkspaceError):
        sandbox.put_dir(str(tmp_path), "root_link/tmp")
    assert sandbox.exec("test -e /tmp/escaped.txt").exit_code == 1


def test_paths_that_stay_inside_are_allowed(make, any_backend):
    sandbox = make(any_backend)
    sandbox.write_file("a/b/../c.txt", "inside")
    assert sandbox.read_file("a/c.txt") == b"inside"
    assert sandbox.read_file(f"{sandbox.workspace}/a/c.txt") == b"inside"
    sandbox.exec("ln -s a/c.txt inner_link")
    assert sandbox.read_file("inner_link") == b"inside"
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        sandbox.read_file("missing.txt")
    with pytest.raises(IsADirectoryError):
        sandbox.read_file("a")
    with pytest.raises(ValueError, match="invalid path"):
        sandbox.read_file("")


def test_files_round_trip_bytes_exactly(make, any_backend):
    sandbox = make(any_backend)
    blob = bytes(range(256)) * 300 + b"\x00\xff\x1eGYRE"
    sandbox.write_file("bin/blob", blob)
    assert sandbox.read_file("bin/blob") == blob
    sandbox.write_file("text.txt", "h\u00e9llo 'quotes' $HOME\n")
    assert sandbox.exec("cat text.txt").stdout == "h\u00e9llo 'quotes' $HOME\n"
    sandbox.write_file("empty", b"")
    assert sandbox.read_file("empty") == b""


def _tree(root: Path) -> dict[str, tuple[bytes, bool]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), bool(p.stat().st_mode & stat.S_IXUSR))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_put_dir_get_dir_round_trip(make, any_backend, tmp_path):
    src = tmp_path / "src"
    (src / "pkg" / "deep").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("X = 1\n")
    (src / "pkg" / "deep" / "data.bin").write_bytes(os.urandom(50_000))
    (src / "empty.txt").write_bytes(b"")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    sandbox = make(any_backend)
    sandbox.put_dir(str(src), "project")
    assert sandbox.exec("./run.sh", cwd=f"{sandbox.workspace}/project").stdout == "ran\n"
    sandbox.get_dir("project", str(tmp_path / "back"))
    assert _tree(tmp_path / "back") == _tree(src)


def test_get_dir_never_writes_outside_the_host_folder(make, any_backend, tmp_path):
    sandbox = make(any_backend)
    _plant_links(sandbox)
    sandbox.write_file("keep.txt", "kept")
    host = tmp_path / "out"
    sentinel_dir = tmp_path / "outside"
    sentinel_dir.mkdir()
    try:
        sandbox.get_dir(".", str(host))
    except (SandboxError, tarfile.TarError) as e:  # refusing the links is fine too
        assert "link" in str(e).lower(), e
    else:
        assert (host / "keep.txt").read_text() == "kept"
    for link in host.rglob("*") if host.exists() else ():
        assert os.path.realpath(link).startswith(str(host)), f"{link} points outside {host}"
    assert list(sentinel_dir.iterdir()) == []


def test_get_dir_refuses_a_crafted_archive(make, any_backend, tmp_path):
    """An agent that controls the sandbox controls what `tar` emits: fake a hostile `tar`
    (a symlink to a host folder, then a file through it) and check nothing lands there."""
    target = tmp_path / "host_target"
    target.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        link = tarfile.TarInfo("./esc")
        link.type, link.linkname = tarfile.SYMTYPE, str(target)
        tar.addfile(link)
        payload = b"pwned"
        info = tarfile.TarInfo("./esc/pwned")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
        dotdot = tarfile.TarInfo("../host_target/pwned2")
        dotdot.size = len(payload)
        tar.addfile(dotdot, io.BytesIO(payload))
    b64 = base64.b64encode(buf.getvalue()).decode()
    sandbox = make(any_backend, env={"PATH": f"/workspace/fakebin:{_default_path(any_backend)}"})
    fake_bin = "fakebin/tar"
    if any_backend == "local":  # the local workspace is a host temp folder, not /workspace
        sandbox.shell.env["PATH"] = f"{sandbox.workspace}/fakebin:{os.environ['PATH']}"
    sandbox.write_file(fake_bin, f"#!/bin/sh\nprintf %s {b64} | base64 -d\n")
    sandbox.exec(f"chmod +x {fake_bin}")
    assert sandbox.exec("command -v tar").stdout.strip().endswith("fakebin/tar")
    with pytest.raises((SandboxError, tarfile.TarError)):
        sandbox.get_dir(".", str(tmp_path / "out"))
    assert list(target.iterdir()) == []


def _default_path(backend: str) -> str:
    return "/usr/local/bin:/usr/bin:/bin" if backend != "local" else os.environ["PATH"]
