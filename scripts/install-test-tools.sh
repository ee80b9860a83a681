#!/usr/bin/env bash
# Install the Debian packages the tests drive for real, when absent: headless Chromium and its
# driver (dashboard browser tests) and Prometheus with promtool (scrape test of /metrics).
set -u
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
[ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ] || need+=(prometheus)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing ${need[*]} and cannot install them here (need root and apt-get)" >&2
  exit 0
fi
echo "installing ${need[*]}"
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
