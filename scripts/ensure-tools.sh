#!/usr/bin/env bash
# Install the machine tools the tests use, when missing: faketime (Debian's package), which runs a worker
# with its clock a minute ahead in tests/test_clock.py. Best effort: without it that one test skips.
set -uo pipefail
command -v faketime >/dev/null 2>&1 && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "ensure-tools: installing Debian's faketime package" >&2
  export DEBIAN_FRONTEND=noninteractive
  (apt-get install -y -qq faketime >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq faketime)) \
    >/dev/null 2>&1 || echo "ensure-tools: could not install faketime; its test will skip" >&2
fi
exit 0
