#!/usr/bin/env bash
# Copies the Boost headers that the HTTP front (src/http/) includes into .carry/include/boost, for
# the GPU machine, which has no Boost and installs nothing: the preprocessor lists exactly the
# headers those files pull in (a few MB, not Boost's 150+).
#   scripts/carry_boost.sh            # needs Debian's libboost-dev here (scripts/setup.sh installs it)
set -euo pipefail
cd "$(dirname "$0")/.."
out=.carry/include
mkdir -p "$out"
headers=$(for source in src/http/*.cpp; do
  g++ -std=c++20 -Isrc -DBOOST_ERROR_CODE_HEADER_ONLY -DBOOST_ASIO_NO_DEPRECATED -M -MT x "$source"
done | tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u)
rm -rf "$out/boost"
for header in $headers; do
  mkdir -p "$out/$(dirname "${header#/usr/include/}")"
  cp "$header" "$out/${header#/usr/include/}"
done
echo "carry_boost: $(echo "$headers" | wc -l) headers, $(du -sh "$out/boost" | cut -f1) in $out/boost"
