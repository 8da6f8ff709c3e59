"""The base image builds C extensions and has the whole standard library (issue 39): tests
written against a full CPython (markupsafe's speedups, six's tkinter and dbm moves) must
not skip in a task image.

Checks the image ``images.build_base_image`` makes (reused when its recipe is current);
``GYRE_BASE_TAG_UNDER_TEST`` names another tag to check, e.g. a private build."""

from __future__ import annotations

import os
import subprocess

import pytest

from gyre_env.sandbox import images

TAG = os.environ.get("GYRE_BASE_TAG_UNDER_TEST", images.DEFAULT_TAG)


def test_recipe_names_a_toolchain_and_the_split_out_stdlib():
    apt = images._dockerfile_args()["GYRE_APT_PACKAGES"].split()
    for pkg in (
        "gcc",
        "libc6-dev",
        "make",
        "python3-dev",
        "python3-tk",
        "python3-gdbm",
        "python3-lib2to3",
        "python3-distutils",
    ):
        assert pkg in apt


@pytest.fixture(scope="module")
def base_image():
    return images.build_base_image(TAG, progress=lambda line: print(line, flush=True))


EXTENSION = r"""
set -e
cd "$(mktemp -d)"
cat > gyre_ext.c <<'C'
#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *arg) {
    return PyNumber_Add(arg, arg);
}
static PyMethodDef methods[] = {{"twice", twice, METH_O, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "gyre_ext", "", -1, methods};
PyMODINIT_FUNC PyInit_gyre_ext(void) { return PyModule_Create(&mod); }
C
printf 'from setuptools import setup, Extension\nsetup(name="gyre-ext", version="0", ext_modules=[Extension("gyre_ext", ["gyre_ext.c"])])\n' > setup.py
python setup.py -q build_ext --inplace 2>&1 | tail -3
python -c 'import gyre_ext; print("twice", gyre_ext.twice(21))'
python -c 'import tkinter, dbm.gnu, dbm.ndbm, lib2to3, distutils, sqlite3, ctypes, curses; print("stdlib ok", tkinter.TkVersion)'
"""


@pytest.mark.docker
def test_base_image_builds_a_c_extension_and_imports_the_full_stdlib(base_image):
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", TAG, "bash", "-c", EXTENSION],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "twice 42" in proc.stdout and "stdlib ok" in proc.stdout
