#!/usr/bin/env bash
# Make /usr/bin/chromium available for the report's browser test (tests/test_report.py).
# Idempotent: does nothing when it is already there. Installs from the Debian archive when
# running as root; otherwise prints the command to run and fails, so CI never silently skips.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_chromium: $CHROMIUM is missing; install it as root with:" >&2
    echo "  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium" >&2
    exit 1
fi

apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

if [ ! -x "$CHROMIUM" ]; then
    echo "ensure_chromium: apt-get finished but $CHROMIUM is still missing" >&2
    exit 1
fi
echo "ensure_chromium: $("$CHROMIUM" --version 2>/dev/null || echo chromium) installed"
