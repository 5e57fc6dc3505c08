# The Node.js sandbox image. Sourced by deploy/images/build.sh; see
# python/recipe.sh for what each setting means.
suite=bookworm
files=(
  "launch.js /usr/lib/kiln/launch.js 0644"
  "session.js /usr/lib/kiln/session.js 0644"
  "list_packages.js /usr/lib/kiln/list_packages.js 0644"
  # A session's box is supervised by the python box supervisor (links to
  # python/): it makes the inner sandbox and relays calls to session.js.
  "launch.py /usr/lib/kiln/launch.py 0644"
  "kilnproto.py /usr/lib/kiln/kilnproto.py 0644"
  "runner.py /usr/lib/kiln/runner.py 0644"
  "box.py /usr/lib/kiln/box.py 0644"
  "session.py /usr/lib/kiln/session.py 0644"
  "relay.py /usr/lib/kiln/relay.py 0644"
  "commands.py /usr/lib/kiln/commands.py 0644"
  "jail.py /usr/lib/kiln/jail.py 0644"
  "zygote.py /usr/lib/kiln/zygote.py 0644"
  "preloader.py /usr/lib/kiln/preloader.py 0644"
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
