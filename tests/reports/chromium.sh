#!/usr/bin/env bash
# Debian's headless Chromium for the report-page test (tests/reports/test_page_in_browser.py): `chromium.sh install`
# installs it as root when it is missing (what `make test` does on CI); without root the test skips when it is absent.
set -euo pipefail
[[ ${1:-} == install ]] || { echo "usage: chromium.sh install" >&2; exit 2; }
if dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "ok installed"; then
    echo "[chromium.sh] already installed" >&2; exit 0
fi
[[ $(id -u) == 0 ]] || { echo "[chromium.sh] error: must run as root to install" >&2; exit 1; }
echo "[chromium.sh] installing chromium" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/dev/null
echo "[chromium.sh] installed" >&2
