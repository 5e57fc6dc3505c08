"""Prints what this image's Python can import, as JSON, for the runtime's
package list (GET /v1/runtimes). Run by deploy/images/build.sh inside the
finished root filesystem:

    {"language": "python", "version": "3.11.2",
     "packages": [{"name": "pandas", "version": "1.5.3", "modules": ["pandas"]}, ...]}

name and version are the distribution's (what pip would call it); modules are
the top-level names a program imports ("sklearn" for scikit-learn).
"""

import importlib
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import sys


def modules_of(dist):
    top = dist.read_text("top_level.txt")
    if top:
        names = [line.strip() for line in top.splitlines()]
    else:
        # No top_level.txt (newer build back-ends): the top-level entries
        # of its installed files.
        names = []
        for f in dist.files or []:
            part = f.parts[0]
            if part.endswith((".dist-info", ".egg-info")) or part in ("..", "__pycache__"):
                continue
            if len(f.parts) == 1:
                if not part.endswith(".py"):
                    continue
                part = part[:-3]
            names.append(part.split(".")[0])
    if not names:
        # Neither (Debian drops RECORD from some egg-info): the distribution's
        # own name, when a module of that name sits beside its metadata.
        site = os.path.dirname(str(dist._path))
        for cand in {dist.metadata["Name"], dist.metadata["Name"].lower(), dist.metadata["Name"].lower().replace("-", "_")}:
            if os.path.isdir(os.path.join(site, cand)) or os.path.isfile(os.path.join(site, cand + ".py")):
                names.append(cand)
    # Only names that resolve to a module (top_level.txt can list a build's
    # leftovers, such as kiwisolver's "src"); find_spec does not import.
    return sorted({n for n in names if n and n.isidentifier() and not n.startswith("_") and importlib.util.find_spec(n) is not None})


def main():
    seen = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if not name or name.lower() in seen:
            continue
        mods = modules_of(dist)
        if not mods:
            continue
        seen[name.lower()] = {"name": name, "version": dist.version, "modules": mods}
    out = {
        "language": "python",
        "version": platform.python_version(),
        "packages": sorted(seen.values(), key=lambda p: p["name"].lower()),
    }
    if "--import-all" in sys.argv[1:]:
        # The build's smoke test: every listed module must import (a
        # customize step that strips too much fails the build, not a job).
        import subprocess

        bad = []
        for p in out["packages"]:
            for m in p["modules"]:
                try:
                    importlib.import_module(m)
                except Exception as e:
                    # One that clashes with another imported before it
                    # (setuptools replaces distutils as it is imported)
                    # imports in a process of its own, as a job's would.
                    alone = subprocess.run([sys.executable, "-I", "-B", "-c", "import " + m], capture_output=True)
                    if alone.returncode != 0:
                        bad.append("%s (%s): %s: %s" % (m, p["name"], type(e).__name__, e))
        if bad:
            sys.exit("these listed modules do not import:\n  " + "\n  ".join(bad))
        print("%d packages, all %d listed modules import" % (len(out["packages"]), sum(len(p["modules"]) for p in out["packages"])))
        return
    json.dump(out, sys.stdout, separators=(",", ":"))


if __name__ == "__main__":
    main()
