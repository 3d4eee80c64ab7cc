#!/usr/bin/env bash
# Installs the Debian packages Tether builds and tests with, when missing.
# Sourced by the other scripts; safe to run again.
set -euo pipefail

TETHER_APT_PACKAGES=(pkg-config libsqlite3-dev liblz4-dev libssl-dev sqlite3 openssl)

if ! command -v swift >/dev/null 2>&1 && [ -x /opt/swift/usr/bin/swift ]; then
    export PATH="/opt/swift/usr/bin:$PATH"
fi
if ! command -v swift >/dev/null 2>&1; then
    echo "setup: swift is not on PATH (Tether needs Swift 6.3)" >&2
    exit 1
fi

missing=()
for package in "${TETHER_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    elif command -v sudo >/dev/null 2>&1; then
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "setup: missing Debian packages ${missing[*]}, and not root to install them" >&2
        exit 1
    fi
fi
