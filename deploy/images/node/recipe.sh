# The Node.js sandbox image. Sourced by deploy/images/build.sh; see
# python/recipe.sh for what each setting means.
suite=bookworm
files=(
  "launch.js /usr/lib/kiln/launch.js 0644"
  "list_packages.js /usr/lib/kiln/list_packages.js 0644"
)
# The worker puts the profile's interpreter flags (the V8 heap bound derived
# from the job's memory limit) after "node".
entrypoint=(node /usr/lib/kiln/launch.js)
workdir=/work
user=65534:65534
env=(
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  LANG=C.UTF-8
)
customize() {
  local root=$1
  install -d -m 0755 "$root/work"
}
smoke=(node -e 'console.log("node", process.version)')
list_packages=(node /usr/lib/kiln/list_packages.js)
