#!/usr/bin/env bash
# launcher report's page in a browser: a real job's page (mlp on 2 ranks,
# restarted after a SIGKILL) opened in headless Chromium, with no console
# message and every plot drawn (launch TestReportInBrowser). Installs
# Debian's chromium when it is missing, then runs the test with the browser
# required (no skip); the screenshot is kept in .ci/artifacts/report.png.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v chromium >/dev/null 2>&1; then
  command -v apt-get >/dev/null || { echo "report-chromium.sh: chromium missing and no apt-get" >&2; exit 1; }
  echo "report-chromium.sh: installing chromium"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
MESHRUN_REQUIRE_CHROMIUM=1 MESHRUN_ARTIFACTS="$PWD/.ci/artifacts" .ci/gotest report-chromium -count=1 -run '^TestReportInBrowser$' ./launch/
