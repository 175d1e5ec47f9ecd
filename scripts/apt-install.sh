#!/usr/bin/env bash
# apt-install.sh PACKAGE...: installs the Debian packages not installed yet,
# as root or through sudo (scripts/proto.sh, make test). Nothing to do, no
# apt-get run.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}" >&2
if [ "$(id -u)" = 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
else
  sudo apt-get update -qq && sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
