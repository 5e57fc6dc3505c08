package sandbox

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// importAll imports every module named in argv[1] (a JSON list) and prints
// the ones that fail, with why.
const importAll = `
import importlib, json, sys
bad = []
for m in json.loads(sys.argv[1]):
    try:
        importlib.import_module(m)
    except BaseException as e:
        bad.append("%s: %s: %s" % (m, type(e).__name__, e))
print(json.dumps(bad))
`

// TestListedPythonPackagesImport checks the runtime's advertised package
// list (GET /v1/runtimes) against the image: every listed module imports.
func TestListedPythonPackagesImport(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"python", "python-slim"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rt := setupRuntimes(t, name)
			info, err := rt.RuntimeInfo(t.Context(), name)
			if err != nil {
				t.Fatal(err)
			}
			if info.Language != "python" || !strings.HasPrefix(info.Version, "3.") || info.MainFile != "main.py" {
				t.Fatalf("runtime info %+v", info.RuntimeContract)
			}
			// The worker advertises what Run enforces, nothing of its own.
			if info.Limits != rt.cfg.Policy || info.Limits.Max == (job.Limits{}) {
				t.Errorf("advertised policy %+v, want the one Run enforces %+v", info.Limits, rt.cfg.Policy)
			}
			var mods []string
			for _, p := range info.Packages {
				if p.Name == "" || p.Version == "" || len(p.Modules) == 0 {
					t.Errorf("package entry %+v lacks a name, version or module", p)
				}
				mods = append(mods, p.Modules...)
			}
			want := []string{"numpy"}
			if name == "python" {
				want = append(want, "pandas", "scipy", "sklearn", "matplotlib", "seaborn", "statsmodels", "sympy", "networkx",
					"openpyxl", "bs4", "lxml", "yaml", "PIL", "tabulate", "dateutil", "pytz", "requests")
			}
			for _, w := range want {
				if !info.Provides(w) {
					t.Errorf("package list of %s lacks module %s", name, w)
				}
			}
			arg, _ := json.Marshal(mods)
			spec := job.Spec{Runtime: name, Code: importAll, Args: []string{string(arg)}, Limits: job.Limits{TimeoutMS: 120_000, CPUMS: 120_000, MemoryMB: 1024}}
			res := run(t, rt, spec)
			if res.Status != job.StatusSucceeded || strings.TrimSpace(res.Stdout) != "[]" {
				t.Fatalf("importing the %d listed modules of %s: %s %+v\n%s\n%s", len(mods), name, res.Status, res.Error, res.Stdout, tailOf(res.Stderr))
			}
			t.Logf("%s: %d packages, %d modules import (python %s)", name, len(info.Packages), len(mods), info.Version)
		})
	}
}

// TestSourceBytesAsTheInterpreterReadsThem: a UTF-8 BOM and a coding cookie
// mean what they mean to `python3 main.py`, and node strips a BOM.
func TestSourceBytesAsTheInterpreterReadsThem(t *testing.T) {
	t.Parallel()
	rt := setupRuntimes(t, "python-slim")
	// The code travels as UTF-8; with a latin-1 cookie, python decodes those
	// bytes as latin-1, so "é" (two bytes in UTF-8) is two characters.
	requireSucceeded(t, run(t, rt, job.Spec{Runtime: "python-slim", Code: "# -*- coding: latin-1 -*-\ns = 'é'\nprint(len(s), [hex(ord(c)) for c in s])"}), "2 ['0xc3', '0xa9']\n")
	requireSucceeded(t, run(t, rt, job.Spec{Runtime: "python-slim", Code: "\ufeffprint('bom ok', len('é'))"}), "bom ok 1\n")
	res := run(t, rt, job.Spec{Runtime: "python-slim", Code: "# coding: no-such-codec\nprint(1)"})
	requireFailed(t, res, job.StatusFailed, job.CategorySyntaxError, "unknown encoding")
}
