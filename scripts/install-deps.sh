#!/usr/bin/env bash
# Installs the Debian packages qrig builds and tests with (idempotent; used by .ci/run and README). nginx-light
# is for tests/server/client/nginx.test.mjs (the documented proxy configuration), which runs its own nginx; the
# service apt may start (outside containers with a policy-rc.d) is not used.
#
# NVRTC 11.8 from Debian's non-free component (libnvrtc11.2 + libnvrtc-builtins11.8, ~60 MB): the kernel
# compiler that targets sm_70 (CMP 100-210, V100; NVRTC 13 cannot) and everything up to sm_90, loaded by qrig
# at run time. On a machine without the CUDA toolkit it is the NVRTC qrig uses; the tests compile every kernel
# of the CMP plans with it. When apt does not know the package, the non-free component is added for it
# (/etc/apt/sources.list.d/qrig-non-free.sources, the same mirror as the system's main component).
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
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

nvrtc=(libnvrtc11.2 libnvrtc-builtins11.8)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
if ! installed libnvrtc11.2 || ! installed libnvrtc-builtins11.8; then
  candidate() { apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}'; }
  if [ -z "$(candidate libnvrtc11.2)" ] || [ "$(candidate libnvrtc11.2)" = "(none)" ]; then
    codename=$( . /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    mirror=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -1)
    [ -n "$mirror" ] || mirror=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -v security | head -1)
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    if [ -n "$codename" ]; then
      echo "install-deps: adding Debian's non-free component ($mirror $codename) for NVRTC 11.8"
      printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$mirror" "$codename" "$codename" | $SUDO tee /etc/apt/sources.list.d/qrig-non-free.sources >/dev/null
      $SUDO apt-get update -qq
    fi
  fi
  echo "install-deps: installing ${nvrtc[*]} (NVRTC 11.8, non-free: the sm_70 kernel compiler)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${nvrtc[@]}" ||
    echo "install-deps: warning: NVRTC 11.8 could not be installed; sm_70 kernels cannot be compiled (tests say so)" >&2
fi
