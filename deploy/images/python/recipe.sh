# The default Python sandbox image: python3 and the data stack. Sourced by
# deploy/images/build.sh, which installs the Debian packages listed in
# ./packages with mmdebstrap, copies the files below in, runs customize, and
# packs the result as an OCI image. Every file in this folder feeds the
# recipe hash that names the image.

# Debian release the packages come from.
suite=bookworm

# Empty stand-ins for build-time-only dependencies (build.sh makes them):
# python3-scipy depends on the pythran compiler, which brings g++, the boost
# headers and python3-dev (~600 MB) that nothing imports at run time.
stubs=(python3-pythran)

# Copied into the image: "source-in-this-folder destination mode".
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

# OCI image config. The worker starts the entrypoint with the profile's
# interpreter_flags (runtime.json) after its first word: python3 -s -P -B
# launch.py is -I without -E, so the sandbox's PYTHONHASHSEED=0 is read and
# str hashes (and set order) are the same on every run, as a result cache
# needs. A job's own env is applied by the launcher after start-up and cannot
# change how the interpreter starts.
entrypoint=(python3 /usr/lib/kiln/launch.py)
workdir=/work
user=65534:65534
env=(
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  LANG=C.UTF-8
  MPLBACKEND=Agg
  MPLCONFIGDIR=/tmp/matplotlib
)

# customize ROOTFS: final touches after the packages are installed.
customize() {
  local root=$1
  # The job's work dir; the runtime mounts a size-capped tmpfs over it.
  install -d -m 0755 "$root/work"
  # Test suites shipped inside the Debian packages (pandas alone has 36 MB);
  # nothing imports them at run time.
  # bottleneck imports its tests package at import time.
  find "$root"/usr/lib/python3/dist-packages -depth -type d -name tests \
    -not -path '*/dist-packages/bottleneck/tests' -exec rm -rf {} +
  # Fonts matplotlib does not use and sample data nobody loads offline.
  rm -rf "$root"/usr/share/matplotlib/sample_data
  # matplotlib's font cache, built once here: the preloader copies it into
  # the zygote's config dir (preloader.py FONT_CACHE) instead of listing
  # every font in every box. PYTHONHASHSEED=0: the font list is a set, and
  # its order (the file's bytes) must not change between builds.
  install -d -m 0755 "$root/usr/lib/kiln/matplotlib"
  chroot "$root" env -i PYTHONHASHSEED=0 MPLBACKEND=Agg MPLCONFIGDIR=/usr/lib/kiln/matplotlib \
    python3 -B -c 'import matplotlib.font_manager'
  chmod 0644 "$root"/usr/lib/kiln/matplotlib/fontlist-*.json
}

# Run inside the finished root filesystem (chroot, as nobody); the build
# fails if it does.
smoke=(python3 -I -B /usr/lib/kiln/list_packages.py --import-all)

# Prints the image's importable packages as JSON (GET /v1/runtimes).
list_packages=(python3 -I -B /usr/lib/kiln/list_packages.py)
