#!/usr/bin/env bash
# Makes sure Prometheus, promtool and Chromium are installed for the fleet observability tests
# (tests/observability.rs), which start their own Prometheus on a loopback port and render the
# dashboard with headless Chromium. Installs Debian's `prometheus` and `chromium` packages when
# a binary is missing. The package's own Prometheus service is not wanted: the install runs with
# service starts denied (policy-rc.d), and a service the package did start is stopped and
# disabled, so nothing is left listening on :9090. Idempotent: returns at once when all are there.
set -euo pipefail

missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v promtool >/dev/null || { [[ " ${missing[*]-} " == *" prometheus "* ]] || missing+=(prometheus); }
command -v chromium >/dev/null || missing+=(chromium)

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-observability: $(prometheus --version 2>&1 | head -1); $(chromium --version 2>/dev/null | head -1)" >&2
  exit 0
fi

command -v apt-get >/dev/null || { echo "error: ${missing[*]} not installed and this is not a Debian-like system: install Prometheus (with promtool) and Chromium" >&2; exit 1; }
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "error: installing ${missing[*]} needs root: run \`sudo apt-get install ${missing[*]}\`" >&2; exit 1; }
  sudo="sudo"
fi

# Deny service starts during the install (exit 101 is "action forbidden" to invoke-rc.d),
# unless the machine already has such a policy; ours is removed afterwards.
policy=/usr/sbin/policy-rc.d
own_policy=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod +x "$policy"
  own_policy=1
fi
cleanup() { if [ -n "$own_policy" ]; then $sudo rm -f "$policy"; fi; }
trap cleanup EXIT

echo "setup-observability: apt-get install ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

# Where systemd runs, make sure the packaged service stays off (it would hold :9090).
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  $sudo systemctl disable --now prometheus prometheus-node-exporter 2>/dev/null || true
fi

for bin in prometheus promtool chromium; do
  command -v "$bin" >/dev/null || { echo "error: $bin is still missing after installing ${missing[*]}" >&2; exit 1; }
done
echo "setup-observability: $(prometheus --version 2>&1 | head -1); $(chromium --version 2>/dev/null | head -1)" >&2
