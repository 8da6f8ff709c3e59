"""Tests of the base sandbox image builder (gyre_env/sandbox/images.py).

The ``docker`` tests use the real daemon and the real base image. They reuse
``gyre-base:latest`` when its recipe is current (CI builds it before the tests with
``gyre images build``) and build it otherwise (about two minutes, offline from any
registry). Nothing is faked. Without a daemon they skip, or fail where ``CI`` is set
(tests/conftest.py).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile

import pytest

from gyre_env.sandbox import debian, hostusr, images

BASE = images.DEFAULT_TAG
HOST_USR_TAG = f"gyre-test-hostusr-{os.getpid()}:latest"


# ---------------------------------------------------------------- recipe, parsing, bad input


def test_dockerfile_args_are_the_recipe():
    args = images._dockerfile_args()
    assert args["BASE"] == "python:3.11-slim"
    apt = args["GYRE_APT_PACKAGES"].split()
    for pkg in ("bash", "coreutils", "tar", "procps", "python3", "python3-pip", "python3-venv"):
        assert pkg in apt
    pins = dict(r.split("==") for r in args["GYRE_PIP_REQUIREMENTS"].split())
    assert set(pins) == {"pytest", "ruff", "setuptools", "wheel"}
    assert args["GYRE_EXTRA_PIP"] == ""


def test_recipe_hash_names_method_extras_and_files(tmp_path, monkeypatch):
    base = images.recipe_hash("debootstrap")
    assert base == images.recipe_hash("debootstrap")
    assert base != images.recipe_hash("dockerfile")
    assert base != images.recipe_hash("debootstrap", ["numpy==2.1.0"])
    commented = tmp_path / "commented"
    commented.write_text("# a new comment\n\n" + images.DOCKERFILE.read_text())
    monkeypatch.setattr(images, "DOCKERFILE", commented)
    assert images.recipe_hash("debootstrap") == base  # comments do not count
    changed = tmp_path / "changed"
    changed.write_text(images.DOCKERFILE.read_text() + "\nENV CHANGED=1\n")
    monkeypatch.setattr(images, "DOCKERFILE", changed)
    assert images.recipe_hash("debootstrap") != base


def test_debian_mirror_reads_one_line_and_deb822_sources(tmp_path):
    one_line = tmp_path / "sources.list"
    one_line.write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main\n"
    )
    assert debian.debian_mirror([str(one_line)]) == "http://mirror.example/debian"
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "a.sources").write_text(
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://good.example/debian\nSuites: bookworm bookworm-updates\n"
    )
    (d / "ignored.txt").write_text("deb http://never.example/debian bookworm main\n")
    assert debian.debian_mirror([str(d)]) == "http://good.example/debian"
    ubuntu = tmp_path / "ubuntu.list"
    ubuntu.write_text("deb http://archive.ubuntu.com/ubuntu noble main\n")
    assert debian.debian_mirror([str(ubuntu), "/nonexistent"]) == debian.DEFAULT_MIRROR


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"method": "podman"}, ValueError, "podman"),
        ({"extra_requirements": "numpy"}, TypeError, "list of requirement"),
        ({"extra_requirements": ["numpy scipy"]}, ValueError, "numpy scipy"),
        ({"extra_requirements": ["x; rm -rf /"]}, ValueError, "rm -rf"),
        ({"method": "host-usr", "extra_requirements": ["numpy"]}, ValueError, "host Python"),
    ],
)
def test_bad_input_is_refused_before_any_build(kwargs, error, match):
    with pytest.raises(error, match=match):
        images.build_base_image("gyre-never-built:x", progress=_fail_on_progress, **kwargs)


def _fail_on_progress(line: str) -> None:
    raise AssertionError(f"bad input reached the build: {line}")


def test_host_mount_labels_round_trip_and_malformed_labels_are_named():
    labels = {images.LABEL_HOST_MOUNTS: '[["/usr", "/usr"], ["/opt/py", "/opt/py"]]'}
    assert images.host_mounts_from_labels(labels) == [("/usr", "/usr"), ("/opt/py", "/opt/py")]
    assert images.docker_run_flags(labels) == ["-v", "/usr:/usr:ro", "-v", "/opt/py:/opt/py:ro"]
    assert images.host_mounts_from_labels({}) == []
    assert images.host_mounts_from_labels(None) == []
    with pytest.raises(ValueError, match="malformed gyre.host_mounts"):
        images.host_mounts_from_labels({images.LABEL_HOST_MOUNTS: "/usr:/usr"})


def test_host_usr_layout_binds_usr_and_the_running_python():
    mounts = dict(hostusr.mounts())
    assert mounts["/usr"] == "/usr"
    prefix = os.path.realpath(sys.prefix)
    if not prefix.startswith("/usr/"):
        assert mounts[prefix] == prefix
    with tarfile.open(fileobj=io.BytesIO(hostusr.rootfs_tar())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["workspace"].isdir() and members["workspace"].uid == 1000
    assert members["tmp"].mode == 0o1777
    assert "gyre:x:1000" in tar_text(hostusr.rootfs_tar(), "etc/passwd")
    for top in ("bin", "lib"):
        if os.path.islink(f"/{top}"):
            assert members[top].issym() and members[top].linkname == os.readlink(f"/{top}")


def tar_text(data: bytes, name: str) -> str:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.extractfile(name).read().decode()


def test_runtime_settings_come_from_the_dockerfile():
    changes = images._dockerfile_runtime_changes()
    assert "WORKDIR /workspace" in changes and 'CMD ["bash"]' in changes
    env = next(c for c in changes if c.startswith("ENV "))
    assert "LANG=C.UTF-8" in env and "\\" not in env  # continuation lines joined


def test_debootstrap_problems_are_named(monkeypatch):
    monkeypatch.setattr(debian.shutil, "which", lambda name: None)
    assert "apt-get install debootstrap" in debian.problem()
    monkeypatch.setattr(debian.shutil, "which", lambda name: "/usr/sbin/" + name)
    monkeypatch.setattr(debian.os, "geteuid", lambda: 1000)
    assert "needs root" in debian.problem()


def test_split_ref():
    assert images._split_ref("gyre-base:latest") == ("gyre-base", "latest")
    assert images._split_ref("gyre-base") == ("gyre-base", "latest")
    assert images._split_ref("localhost:5000/gyre") == ("localhost:5000/gyre", "latest")
    assert images._split_ref("localhost:5000/gyre:v1") == ("localhost:5000/gyre", "v1")


def test_cli_parses_build_and_show():
    parser = argparse.ArgumentParser(prog="gyre")
    images.add_images_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["images", "build", "--method", "debootstrap", "--extra", "numpy==2.1.0", "--force"]
    )
    assert (args.method, args.extra, args.force, args.tag) == (
        "debootstrap",
        ["numpy==2.1.0"],
        True,
        images.DEFAULT_TAG,
    )
    assert args.func is images._cmd_build
    assert parser.parse_args(["images", "show", "--tag", "x:y"]).func is images._cmd_show
    with pytest.raises(SystemExit):
        parser.parse_args(["images", "build", "--method", "podman"])


# ---------------------------------------------------------------- real images on the daemon


@pytest.fixture(scope="module")
def base_image():
    return images.build_base_image(BASE, progress=lambda line: print(line, flush=True))


@pytest.fixture(scope="module")
def host_usr_image():
    built = images.build_base_image(HOST_USR_TAG, method="host-usr", force=True)
    yield built
    subprocess.run(["docker", "rmi", "-f", HOST_USR_TAG], capture_output=True)


def _run(image: str, script: str, *flags: str, timeout: float = 120) -> str:
    """``docker run --rm --network none`` a bash script; fail with its output if it fails."""
    cmd = ["docker", "run", "--rm", "--network", "none", *flags, image, "bash", "-c", script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def _labels(tag: str) -> dict:
    import docker

    return docker.from_env().images.get(tag).labels


@pytest.mark.docker
def test_base_image_is_labelled_with_its_current_recipe(base_image):
    labels = _labels(BASE)
    assert labels[images.LABEL_METHOD] in ("dockerfile", "debootstrap")
    assert labels[images.LABEL_RECIPE] == images.recipe_hash(labels[images.LABEL_METHOD])
    assert images.host_mounts_from_labels(labels) == []  # self-contained: no host binds


@pytest.mark.docker
def test_base_image_has_python_pytest_ruff_and_shell_tools_offline(base_image):
    out = _run(
        BASE,
        # `python`, not only python3: task commands and agents call it by that name.
        "python -c 'import sys, pytest; print(sys.version_info[:2], pytest.__version__)'"
        " && ruff --version && ps -p 1 -o comm= && echo Z3lyZQ== | base64 -d && echo"
        " && tar --version | head -1 && pwd",
    )
    lines = out.splitlines()
    assert lines[0].startswith("(3, 11)")
    assert lines[1].startswith("ruff ")
    assert "gyre" in lines and lines[-1] == "/workspace"


@pytest.mark.docker
def test_base_image_installs_a_workspace_package_offline_and_runs_its_tests(base_image, tmp_path):
    _tiny_package(tmp_path)
    out = _run(
        BASE,
        "cp -r /src /workspace/pkg && cd /workspace/pkg"
        " && pip install --no-build-isolation -e . -q && cd /"
        " && python3 -c 'import tinypkg; print(tinypkg.answer(), tinypkg.__file__)'"
        " && cd /workspace/pkg && python3 -m pytest -q -p no:cacheprovider tests",
        "-v",
        f"{tmp_path}:/src:ro",
    )
    assert "42 /workspace/pkg/tinypkg/__init__.py" in out
    assert "1 passed" in out


@pytest.mark.docker
def test_current_image_is_reused_not_rebuilt(base_image):
    lines: list[str] = []
    again = images.build_base_image(BASE, progress=lines.append)
    assert again.reused and again.image_id == _image_id(BASE)
    assert again.seconds < 5
    assert "up to date" in lines[0]


@pytest.mark.slow
@pytest.mark.docker
def test_host_usr_image_runs_with_the_binds_its_label_names(host_usr_image, tmp_path):
    labels = _labels(HOST_USR_TAG)
    assert labels[images.LABEL_METHOD] == "host-usr"
    flags = images.docker_run_flags(labels)
    assert ["-v", "/usr:/usr:ro"] == flags[:2]
    assert host_usr_image.host_mounts == images.host_mounts_from_labels(labels)
    # Without the binds the image is an empty shell: no bash, no python.
    bare = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", HOST_USR_TAG, "bash", "-c", "true"],
        capture_output=True,
        timeout=60,
    )
    assert bare.returncode != 0
    _tiny_package(tmp_path)
    out = _run(
        HOST_USR_TAG,
        "ruff --version && touch /usr/x 2>/dev/null && echo USR-WRITABLE;"
        " cp -r /src /workspace/pkg && cd /workspace/pkg"
        " && pip install --no-build-isolation -e . -q && cd /"
        " && python3 -c 'import tinypkg; print(tinypkg.answer())'",
        *flags,
        "-v",
        f"{tmp_path}:/src:ro",
    )
    assert "ruff " in out and "42" in out.splitlines()
    assert "USR-WRITABLE" not in out  # the host's /usr is bound read-only


@pytest.mark.docker
def test_changed_recipe_rebuilds_and_unchanged_reuses(host_usr_image, monkeypatch):
    same = images.build_base_image(HOST_USR_TAG, method="host-usr", progress=lambda _: None)
    assert same.reused and same.recipe == host_usr_image.recipe
    monkeypatch.setattr(hostusr, "LAYOUT_VERSION", "changed-by-test")
    rebuilt = images.build_base_image(HOST_USR_TAG, method="host-usr", progress=lambda _: None)
    assert not rebuilt.reused and rebuilt.recipe != host_usr_image.recipe
    assert _labels(HOST_USR_TAG)[images.LABEL_RECIPE] == rebuilt.recipe


@pytest.mark.docker
def test_failed_check_never_replaces_a_working_image(host_usr_image, monkeypatch):
    before = _image_id(HOST_USR_TAG)
    monkeypatch.setattr(hostusr, "mounts", lambda: [])  # no binds: no bash, no python inside
    with pytest.raises(images.ImageBuildError, match="lacks a tool"):
        images.build_base_image(HOST_USR_TAG, method="host-usr", progress=lambda _: None)
    assert _image_id(HOST_USR_TAG) == before
    staging = subprocess.run(
        ["docker", "images", "-q", "--filter", f"reference={HOST_USR_TAG.split(':')[0]}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert staging == [before[7:19]]  # the staging image was removed


def _image_id(tag: str) -> str:
    import docker

    return docker.from_env().images.get(tag).id


def _tiny_package(root) -> None:
    """A setuptools package with one test: what a task's workspace looks like."""
    (root / "tinypkg").mkdir()
    (root / "tinypkg" / "__init__.py").write_text("def answer():\n    return 42\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_answer.py").write_text(
        "from tinypkg import answer\n\ndef test_answer():\n    assert answer() == 42\n"
    )
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tinypkg"\nversion = "0.1"\n'
        '[tool.setuptools]\npackages = ["tinypkg"]\n'
    )
