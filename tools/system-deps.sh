#!/usr/bin/env bash
# Debian packages the tests need: chromium + chromedriver (dashboard browser tests),
# iproute2 (network namespaces and traffic shaping for emulation tests).
# Installs them when running as root; otherwise says which tests will be skipped.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v tc >/dev/null 2>&1 || missing+=(iproute2)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "note: not root, cannot install ${missing[*]}: browser/emulation tests will be skipped" >&2
    exit 0
fi
echo "installing Debian packages: ${missing[*]} ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
