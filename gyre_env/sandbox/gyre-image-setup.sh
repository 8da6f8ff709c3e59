#!/bin/sh
# Provisions Gyre's base sandbox image; run as root by the Dockerfile next to it, on either
# python:3.11-slim or a debootstrap rootfs. Inputs (build args, seen as environment):
# GYRE_APT_PACKAGES, GYRE_PIP_REQUIREMENTS, GYRE_EXTRA_PIP, PIP_INDEX_URL, and GYRE_WHEELS:
# a folder of wheels to install from with no network (the debootstrap build's chroot).
set -eu

missing=""
for pkg in $GYRE_APT_PACKAGES; do
    # python3* come from the base image itself on python:3.11-slim (/usr/local/bin).
    case "$pkg" in python3*) command -v python3 >/dev/null 2>&1 && continue ;; esac
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
ruff --version
for tool in bash tar ps kill base64 git python; do
    command -v "$tool" >/dev/null || { echo "gyre-image-setup: $tool missing" >&2; exit 1; }
done
rm -rf /root/.cache /tmp/* 2>/dev/null || true
echo "gyre-image-setup: done"
