#!/bin/bash
# Builds the jail library (libkilnjail.so) from this folder's sources with
# the host's gcc: `make init` installs it beside kiln-init, the sandbox
# suites build their own (package jail's Build). Usage: build.sh OUT.
# Reproducible: no build id, no absolute source paths.
set -euo pipefail
out=${1:?usage: build.sh OUT}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cc=${CC:-gcc}
mkdir -p "$(dirname "$out")"
srcs=()
for f in "$src"/*.c; do srcs+=("$f"); done
"$cc" -std=gnu11 -O2 -g0 -fPIC -shared -fvisibility=hidden \
  -Wall -Wextra -Werror -Wshadow -Wformat=2 \
  -fstack-protector-strong -D_FORTIFY_SOURCE=2 \
  -ffile-prefix-map="$src"=. \
  -Wl,-z,relro,-z,now,-z,noexecstack -Wl,--build-id=none -Wl,--as-needed \
  -o "$out.tmp" "${srcs[@]}"
mv -f "$out.tmp" "$out"
