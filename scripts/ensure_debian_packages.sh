#!/usr/bin/env bash
# Install the Debian packages tbdzoo's data makers read (docs/datasets.md): dataset-fashion-mnist
# (Fashion-MNIST's idx files, for `tbd data make fashion-mnist-*` and voc-composed) and espeak-ng
# (the speech synthesiser behind `tbd data make spoken-numbers`).
# Idempotent: does nothing when every package is installed. Installs from the Debian archive
# when running as root; otherwise prints the command to run and fails, so CI never silently skips.
set -euo pipefail

PACKAGES=(dataset-fashion-mnist espeak-ng)

missing=()
for package in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_debian_packages: missing ${missing[*]}; install them as root with:" >&2
    echo "  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${missing[*]}" >&2
    exit 1
fi

apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"

for package in "${missing[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        echo "ensure_debian_packages: apt-get finished but $package is still not installed" >&2
        exit 1
    fi
done
echo "ensure_debian_packages: installed ${missing[*]}"
