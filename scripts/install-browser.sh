#!/usr/bin/env bash
# Install Debian's headless Chromium and its driver for the browser tests, when absent.
set -u
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium/chromedriver missing and cannot be installed here (need root and apt-get)" >&2
  exit 0
fi
echo "installing chromium and chromium-driver"
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
