#!/usr/bin/env bash
# apt-install.sh PACKAGE...: installs the Debian packages not installed yet,
# as root or through sudo (scripts/proto.sh, make test, scripts/demo-replicas.sh).
# Nothing to do, no apt-get run. Neither root nor sudo: exit 1 naming the
# packages and the command to run as root.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}" >&2
if [ "$(id -u)" = 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
elif command -v sudo >/dev/null 2>&1; then
  sudo apt-get update -qq && sudo apt-get install -y -qq "${missing[@]}" >/dev/null || {
    echo "apt-install.sh: could not install ${missing[*]} with sudo; as root, run: apt-get install ${missing[*]}" >&2
    exit 1
  }
else
  echo "apt-install.sh: ${missing[*]} missing, and installing needs root: not root and no sudo;" \
    "as root, run: apt-get install ${missing[*]}" >&2
  exit 1
fi
