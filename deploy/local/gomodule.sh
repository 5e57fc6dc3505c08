# Sourced by the scripts that build a pinned tool from its Go module
# (runc.sh, containerd-build.sh).

# module_src MODULE VERSION SUM DEST: downloads MODULE@vVERSION through the Go
# module proxy, refuses it unless its go.sum hash is SUM, and copies its
# source to DEST (writable, for the build).
module_src() {
  local mod=$1 ver=$2 want=$3 dest=$4 info got dir
  info=$(cd "$(dirname "$dest")" && GOFLAGS=-mod=mod go mod download -json "$mod@v$ver")
  got=$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p' <<<"$info")
  dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$info")
  if [ "$got" != "$want" ]; then
    echo "$(basename "$0"): $mod@v$ver has hash $got, pinned $want; refusing to build" >&2
    return 1
  fi
  echo "$(basename "$0"): building $mod@v$ver from $dir"
  cp -r "$dir" "$dest"
  chmod -R u+w "$dest"
}
