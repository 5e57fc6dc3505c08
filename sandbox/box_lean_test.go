package sandbox

import (
	"strings"
	"testing"

	"github.com/kilnrun/kiln/sandbox/runtimes"
)

// A job that imports nothing its runtime preloads runs in a lean box, whose
// zygote preloaded nothing; one that imports a preloaded module runs in a
// box that preloaded the list. Both are boxes built the same way, and both
// run every job in a fresh inner sandbox.
func TestBoxLeanForJobsThatImportNothingPreloaded(t *testing.T) {
	t.Parallel()
	if !testBox() {
		t.Skip("the box path's classes")
	}
	cfg := boxConfig(setupConfig(t))
	cfg.Pool.Preload = map[string][]string{"python": {"numpy", "pandas"}}
	rt := startRuntime(t, cfg)
	plain := runAs(t, rt, "acme", py("import os, sys\nprint('pandas' in sys.modules, os.stat('/work').st_dev)"))
	heavy := runAs(t, rt, "acme", py("import numpy, os, sys\nprint('pandas' in sys.modules, os.stat('/work').st_dev)"))
	p, h := strings.Fields(plain.Stdout), strings.Fields(heavy.Stdout)
	if len(p) != 2 || len(h) != 2 {
		t.Fatalf("jobs: %q %+v; %q %+v", plain.Stdout, plain.Error, heavy.Stdout, heavy.Error)
	}
	if p[0] != "False" || h[0] != "True" {
		t.Errorf("pandas preloaded: %s for a job importing os and sys, %s for one importing numpy; want False, True", p[0], h[0])
	}
	if p[1] == h[1] {
		t.Errorf("both jobs ran in box %s; want a lean one and a preloaded one", p[1])
	}
	if st := rt.BoxStats(); st.Hits+st.Claims < 2 {
		t.Errorf("box stats %+v: want both jobs in boxes", st)
	}
}

// The standard library list the lean choice reads is the image's
// interpreter's.
func TestPythonStdlibListIsTheImages(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	res := runAs(t, rt, "acme", py("import sys\nprint(' '.join(sorted(sys.stdlib_module_names)))"))
	if got, want := strings.TrimSpace(res.Stdout), strings.Join(runtimes.PythonStdlib(), " "); got != want {
		t.Fatalf("the image's standard library differs from runtimes' list:\nimage: %s\nlist:  %s", got, want)
	}
}
