package archcheck

import (
	"fmt"
	"strings"
	"testing"
)

const module = "github.com/kilnrun/kiln"

// The bounds; no type is excepted from them.
const (
	maxBackImports = 19 // imports inside sandbox/ that run back up: fewer than 20
	maxMethods     = 30
	maxFuncLines   = 80 // a function's declaration in sandbox/, in lines
)

// forbidden are the imports no package may make: from the first tree into
// the second.
var forbidden = []Arrow{
	{module + "/producer", module + "/worker"},
}

func modulePackages(t *testing.T) []Package {
	t.Helper()
	pkgs, err := Packages("../..", "./...")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages: not the module", len(pkgs))
	}
	return pkgs
}

func TestSandboxImportsDoNotRunBackUp(t *testing.T) {
	back := BackImports(modulePackages(t), module+"/sandbox")
	if len(back) > maxBackImports {
		t.Errorf("%d imports inside sandbox/ run back up (at most %d): %v", len(back), maxBackImports, back)
	}
}

func TestNoTypeHasTooManyMethods(t *testing.T) {
	counts, err := Methods(Sources(modulePackages(t)))
	if err != nil {
		t.Fatal(err)
	}
	if msg := overBound(counts, maxMethods); msg != "" {
		t.Error(msg)
	}
}

func TestNoLongFunctionInSandbox(t *testing.T) {
	var sb []Package
	for _, p := range modulePackages(t) {
		if under(p.ImportPath, module+"/sandbox") {
			sb = append(sb, p)
		}
	}
	long, err := LongFuncs(Sources(sb), maxFuncLines)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range long {
		t.Errorf("%s is %d lines (at most %d)", f.Name, f.N, maxFuncLines)
	}
}

func TestNoForbiddenImports(t *testing.T) {
	pkgs := modulePackages(t)
	for _, f := range forbidden {
		for _, a := range Forbidden(pkgs, f.From, f.To) {
			t.Errorf("%s: no package under %s may import %s", a, f.From, f.To)
		}
	}
}

// overBound says which counts pass max, "" when none does.
func overBound(counts []Count, max int) string {
	var bad []string
	for _, c := range counts {
		if c.N > max {
			bad = append(bad, fmt.Sprintf("%s has %d methods (at most %d)", c.Name, c.N, max))
		}
	}
	return strings.Join(bad, "; ")
}
