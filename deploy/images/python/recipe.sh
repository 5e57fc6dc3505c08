# The default Python sandbox image. Sourced by deploy/images/build.sh, which
# installs the Debian packages listed in ./packages with mmdebstrap, copies
# the files below in, runs customize, and packs the result as an OCI image.
# Every file in this folder feeds the recipe hash that names the image.

# Debian release the packages come from.
suite=bookworm

# Copied into the image: "source-in-this-folder destination mode".
files=(
  "launch.py /usr/lib/kiln/launch.py 0644"
)

# OCI image config. -s -P is -I without -E: no user site directory and no
# script directory on sys.path, but the environment the sandbox sets is read,
# so its PYTHONHASHSEED=0 makes str hashes (and set order) the same on every
# run, as a result cache needs. A job's own env is applied by the launcher
# after start-up and cannot change how the interpreter starts.
entrypoint=(python3 -s -P -B /usr/lib/kiln/launch.py)
workdir=/work
user=65534:65534
env=(
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  LANG=C.UTF-8
  # No display in a sandbox; without this matplotlib probes for Tk first.
  MPLBACKEND=Agg
  # Writable on the job's /tmp tmpfs; unset, matplotlib warns on every import
  # because $HOME (/nonexistent) is not writable.
  MPLCONFIGDIR=/tmp/matplotlib
)

# customize ROOTFS: final touches after the packages are installed.
customize() {
  local root=$1
  # The job's work dir; the runtime mounts a size-capped tmpfs over it.
  install -d -m 0755 "$root/work"
  # Test suites shipped inside the Debian packages (pandas alone has 36 MB);
  # nothing imports them at run time.
  rm -rf "$root"/usr/lib/python3/dist-packages/*/tests \
    "$root"/usr/lib/python3/dist-packages/*/*/tests \
    "$root"/usr/lib/python3/dist-packages/*/*/*/tests
}

# Run inside the finished root filesystem (chroot, as nobody); the build
# fails if it does.
smoke=(python3 -I -B -c 'import numpy, pandas, matplotlib.pyplot; print("numpy", numpy.__version__, "pandas", pandas.__version__, "matplotlib", matplotlib.__version__)')
