#!/usr/bin/env bash
# Install the machine tools the tests use, when missing, from Debian's packages:
# - faketime: runs a worker with its clock a minute ahead (tests/test_clock.py); without it that test skips;
# - chromium: the headless browser Playwright drives in the dashboard's tests (tests/test_dashboard_browser.py);
#   with CI=true those tests fail without it, elsewhere they skip.
set -uo pipefail
missing=()
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "ensure-tools: installing Debian's ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  (apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq "${missing[@]}")) \
    >/dev/null 2>&1 || echo "ensure-tools: could not install ${missing[*]}; their tests skip (fail with CI=true)" >&2
fi
exit 0
