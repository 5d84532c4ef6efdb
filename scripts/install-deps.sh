#!/usr/bin/env bash
# Installs the Debian packages qrig builds and tests with (idempotent; used by .ci/run and README). nginx-light
# is for tests/server/client/nginx.test.mjs (the documented proxy configuration), which runs its own nginx; the
# service apt may start (outside containers with a policy-rc.d) is not used.
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config git curl
      libfmt-dev libtomlplusplus-dev catch2 libboost-dev libcpp-httplib-dev nlohmann-json3-dev
      libutf8proc-dev libpcre2-dev python3 python3-jinja2 nginx-light)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js (for the openai npm client in server tests): the machine may carry its own build.
command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
