#!/usr/bin/env bash
# install.sh (make sdk-deps): the Node SDKs of scripts/sdk-check, exactly as
# package-lock.json pins them (npm ci), into scripts/sdk-check/node_modules.
# Needs Node.js >= 20 and npm: when `node` is missing it installs Debian's
# nodejs and npm (scripts/apt-install.sh), and fails, saying so, when the
# node it finds is older than 20. Nothing to do (no network) when
# node_modules already holds what the lock file pins.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1; then
  ../apt-install.sh nodejs npm
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "sdk-deps: Node.js $(node --version) is too old: scripts/sdk-check needs Node.js >= 20 (openai 6.x; on Debian 12, NodeSource's nodejs 20 package)" >&2
  exit 1
fi
command -v npm >/dev/null 2>&1 || { echo "sdk-deps: npm not found (it comes with Node.js; Debian: apt-get install npm)" >&2; exit 1; }
stamp=node_modules/.switchyard-package-lock.json
if [ -f "$stamp" ] && cmp -s package-lock.json "$stamp"; then
  exit 0
fi
echo "sdk-deps: npm ci in scripts/sdk-check" >&2
npm ci --no-audit --no-fund --loglevel=error
cp package-lock.json "$stamp"
