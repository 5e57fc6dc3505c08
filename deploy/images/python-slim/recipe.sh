# The slim Python sandbox image: python3 and numpy. Same launcher and
# contract as python/ (every launcher module is a link to it); see
# python/recipe.sh for what each setting means.
suite=bookworm
files=(
  "launch.py /usr/lib/kiln/launch.py 0644"
  "kilnproto.py /usr/lib/kiln/kilnproto.py 0644"
  "runner.py /usr/lib/kiln/runner.py 0644"
  "box.py /usr/lib/kiln/box.py 0644"
  "session.py /usr/lib/kiln/session.py 0644"
  "commands.py /usr/lib/kiln/commands.py 0644"
  "jail.py /usr/lib/kiln/jail.py 0644"
  "zygote.py /usr/lib/kiln/zygote.py 0644"
  "preloader.py /usr/lib/kiln/preloader.py 0644"
  "list_packages.py /usr/lib/kiln/list_packages.py 0644"
)
entrypoint=(python3 /usr/lib/kiln/launch.py)
workdir=/work
user=65534:65534
env=(
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  LANG=C.UTF-8
)
customize() {
  local root=$1
  install -d -m 0755 "$root/work"
  find "$root"/usr/lib/python3/dist-packages -depth -type d -name tests -exec rm -rf {} +
}
smoke=(python3 -I -B /usr/lib/kiln/list_packages.py --import-all)
list_packages=(python3 -I -B /usr/lib/kiln/list_packages.py)
