#!/usr/bin/env bash
# install.sh (make sdk-deps): the Node.js packages of the repository, each
# exactly as its package-lock.json pins them (npm ci), into its own
# node_modules:
#   scripts/sdk-check     the OpenAI and Anthropic Node SDKs (TestServeE2ESDKs)
#   examples/node-plugin  @grpc/grpc-js and @grpc/proto-loader, for the
#                         Node.js example plugin (TestPluginsCheckNodeExample)
# Needs Node.js >= 20 and npm: when `node` is missing it installs Debian's
# nodejs and npm (scripts/apt-install.sh), and fails, saying so, when the
# node it finds is older than 20. Nothing to do (no network) for a
# directory whose node_modules already holds what its lock file pins.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v node >/dev/null 2>&1; then
  scripts/apt-install.sh nodejs npm
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "sdk-deps: Node.js $(node --version) is too old: scripts/sdk-check and examples/node-plugin need Node.js >= 20 (openai 6.x; on Debian 12, NodeSource's nodejs 20 package)" >&2
  exit 1
fi
command -v npm >/dev/null 2>&1 || { echo "sdk-deps: npm not found (it comes with Node.js; Debian: apt-get install npm)" >&2; exit 1; }

# npm_ci DIR: npm ci in DIR unless DIR/node_modules was installed from
# exactly this package-lock.json (a copy of it is the stamp).
npm_ci() {
  local dir=$1
  local stamp=$dir/node_modules/.switchyard-package-lock.json
  if [ -f "$stamp" ] && cmp -s "$dir/package-lock.json" "$stamp"; then
    return 0
  fi
  echo "sdk-deps: npm ci in $dir" >&2
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$dir/package-lock.json" "$stamp"
}

npm_ci scripts/sdk-check
npm_ci examples/node-plugin
