"""The Python inside a bubblewrap sandbox is the one running gyre, a virtualenv's included.

Graders run ``python3 -I`` with pytest inside the sandbox. Under a virtualenv, pytest is
the venv's: a venv's base interpreter alone (Debian's ``/usr/bin/python3``) has none, and
every grade would fail. Real bubblewrap, a real venv; nothing is faked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv

import pytest

PROBE = textwrap.dedent(
    """
    import sys
    from gyre_env.sandbox import SandboxConfig, make_sandbox
    sb = make_sandbox(SandboxConfig(), "bwrap")
    try:
        r = sb.exec("python3 -c 'import sys, pytest; print(sys.prefix)'")
        print(r.exit_code, r.stdout.strip(), r.stderr.strip()[-300:])
    finally:
        sb.close()
    """
)


@pytest.mark.bwrap
def test_bwrap_python_is_the_virtualenv_running_gyre(tmp_path):
    env_dir = tmp_path / "venv"
    # system site packages: gyre and pytest come from the interpreter running this test
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(env_dir)
    out = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    code, prefix, *_ = out.stdout.split()
    assert code == "0", out.stdout
    assert os.path.realpath(prefix) == os.path.realpath(env_dir)
