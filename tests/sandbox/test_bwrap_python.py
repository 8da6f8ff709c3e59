"""The Python inside a bubblewrap sandbox is the one running gyre, a virtualenv's included.

Graders run ``python3 -I`` with pytest inside the sandbox. Under a virtualenv, pytest is
the venv's: a venv's base interpreter alone (Debian's ``/usr/bin/python3``) has none, and
every grade would fail. Real bubblewrap, a real venv; nothing is faked.
"""

from __future__ import annotations

import os
import site
import subprocess
import textwrap
import venv
from pathlib import Path

import pytest

PROBE = textwrap.dedent(
    """
    import sys
    from gyre_env.sandbox import SandboxConfig, make_sandbox
    sb = make_sandbox(SandboxConfig(), "bwrap")
    try:
        r = sb.exec("python3 -c 'import sys; print(sys.prefix)'")
        print(r.exit_code, r.stdout.strip(), r.stderr.strip()[-300:])
    finally:
        sb.close()
    """
)


@pytest.mark.bwrap
def test_bwrap_python_is_the_virtualenv_running_gyre(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    # gyre and pytest come from the environment running this test: its site folders (and
    # their .pth files, an editable install's finder among them) are added to the new venv
    inner = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    outer = [p for p in site.getsitepackages() if os.path.isdir(p)]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in outer)
    (Path(inner) / "outer.pth").write_text(lines)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    code, prefix, *_ = out.stdout.split()
    assert code == "0", out.stdout
    assert os.path.realpath(prefix) == os.path.realpath(env_dir)
