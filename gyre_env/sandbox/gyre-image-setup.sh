#!/bin/sh
# Provisions Gyre's base sandbox image; run as root by the Dockerfile next to it, on either
# python:3.11-slim or a debootstrap rootfs. Inputs (build args, seen as environment):
# GYRE_APT_PACKAGES, GYRE_PIP_REQUIREMENTS, GYRE_EXTRA_PIP, PIP_INDEX_URL, and GYRE_WHEELS:
# a folder of wheels to install from with no network (the debootstrap build's chroot).
set -eu

missing=""
for pkg in $GYRE_APT_PACKAGES; do
    if [ ! -x /usr/bin/python3 ] && command -v python3 >/dev/null 2>&1; then
        # python:3.11-slim's own Python (/usr/local) has its full standard library and
        # headers; its tkinter needs only Tk's shared library.
        case "$pkg" in python3-tk) pkg=libtk8.6 ;; python3*) continue ;; esac
    fi
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $pkg"
    fi
done
if [ -n "$missing" ]; then
    echo "gyre-image-setup: apt-get install$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
fi
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb

# The sandbox is the whole machine of one episode: let pip install into the system Python.
rm -f /usr/lib/python3*/EXTERNALLY-MANAGED

if [ -n "${GYRE_WHEELS:-}" ]; then
    source_args="--no-index --find-links $GYRE_WHEELS"
else
    source_args="--index-url ${PIP_INDEX_URL:-https://pypi.org/simple}"
fi
echo "gyre-image-setup: pip install $GYRE_PIP_REQUIREMENTS ${GYRE_EXTRA_PIP:-} ($source_args)"
python3 -m pip install --no-cache-dir --disable-pip-version-check --root-user-action=ignore \
    $source_args $GYRE_PIP_REQUIREMENTS ${GYRE_EXTRA_PIP:-}

# Task commands and agents say `python`; Debian's python3 package installs only python3.
command -v python >/dev/null 2>&1 || ln -s "$(command -v python3)" /usr/local/bin/python

id gyre >/dev/null 2>&1 || useradd --create-home --uid 1000 --shell /bin/bash gyre
mkdir -p /workspace
chown gyre:gyre /workspace

# Fail the build here, not in a sandbox later, if a tool the tasks rely on is missing.
python3 -c "import pytest, setuptools, wheel"
# The full standard library and a C toolchain that can build an extension module.
python3 -c "import tkinter, dbm.gnu, dbm.ndbm, lib2to3, distutils, sqlite3, ctypes, lzma, bz2, curses, readline, ssl"
inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
printf '#include <Python.h>\nint main(void) { return 0; }\n' > /tmp/gyre-cc-check.c
gcc -fsyntax-only -I"$inc" /tmp/gyre-cc-check.c && rm -f /tmp/gyre-cc-check.c
ruff --version
for tool in bash tar ps kill base64 git python; do
    command -v "$tool" >/dev/null || { echo "gyre-image-setup: $tool missing" >&2; exit 1; }
done
rm -rf /root/.cache /tmp/* 2>/dev/null || true
echo "gyre-image-setup: done"
