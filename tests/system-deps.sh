#!/usr/bin/env bash
# The Debian packages the tests need beyond Python's: chromium (the browser tests drive it
# headless) and systemd's tools (systemd-analyze and systemd-tmpfiles check the units; no
# systemd needs to be running; tests/helpers/seccomp.py loads the units' filters with the
# libseccomp2 that systemd depends on); for tests/system, systemd-nspawn (systemd-container) and
# mmdebstrap to boot a Debian root, podman with runc to build and run the image (crun refuses
# this VM's hybrid cgroups); the PostgreSQL server (postgresql: initdb and pg_ctl, under
# /usr/lib/postgresql/*/bin), whose throwaway clusters the store's tests start
# (tests/helpers/postgres.py). Installs only what is missing; as root, or through sudo.
set -euo pipefail
missing=()
command -v chromium >/dev/null || missing+=(chromium)
{ command -v systemd-analyze && command -v systemd-tmpfiles; } >/dev/null || missing+=(systemd)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
{ command -v initdb || compgen -G '/usr/lib/postgresql/*/bin/initdb'; } >/dev/null \
    || missing+=(postgresql)
[ ${#missing[@]} -eq 0 ] && exit 0
as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo)
echo "installing ${missing[*]} (apt-get)" >&2
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
