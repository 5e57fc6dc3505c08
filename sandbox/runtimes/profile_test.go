package runtimes

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testRules stand for the sandbox's: its base environment, runc and gvisor.
var testRules = Rules{
	BaseEnv: []string{"PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8", "TMPDIR=/tmp", "HOSTNAME=kiln"},
	Isolation: func(s string) error {
		if s == "" || s == "runc" || s == "gvisor" {
			return nil
		}
		return errors.New("unknown isolation " + s)
	},
}

func TestRuntimeProfile(t *testing.T) {
	t.Parallel()
	p, err := Parse(`{"name":"node","language":"javascript","main_file":"main.js","reserved_files":["main.mjs"],
		"interpreter_flags":["--max-old-space-size={heap_mb}"],"heap_percent":60,"env":["NODE_DISABLE_COLORS=1"],
		"reserved_env":["NODE_OPTIONS"],"classifier":"node","preload":[],"limits":{"memory_mb":512}}`, testRules)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(p.LaunchArgs([]string{"node", "/usr/lib/kiln/launch.js"}, 256), " ")
	if got != "node --max-old-space-size=153 /usr/lib/kiln/launch.js" {
		t.Fatalf("launch args %q", got)
	}
	if !p.HeapFlagged() {
		t.Errorf("a {heap_mb} flag is not heap-flagged")
	}
	c := p.Contract(Packages{Version: "18.20.4"})
	if c.MainFile != "main.js" || c.Version != "18.20.4" || strings.Join(c.ReservedEnv, ",") != "NODE_DISABLE_COLORS,NODE_OPTIONS" || c.DefaultLimits.MemoryMB != 512 {
		t.Fatalf("contract %+v", c)
	}
	for _, bad := range []string{
		`{"name":"x","language":"x","main_file":"main.x","classifier":"cobol"}`,
		`{"name":"x","language":"x","main_file":"../main.x","classifier":"python"}`,
		`{"name":"x","language":"x","main_file":"main.x","classifier":"python","env":["PATH=/evil"]}`,
		`{"name":"x","language":"x","main_file":"main.x","classifier":"python","env":["NOEQUALS"]}`,
		`{"name":"x","language":"x","main_file":"main.x","classifier":"python","heap_percent":101}`,
		`{"name":"x","language":"x","main_file":"main.x","classifier":"python","isolation":"kata"}`,
		`{"name":"x","language":"x","main_file":"main.x","classifier":"python","surprise":1}`,
		`{"language":"x","main_file":"main.x","classifier":"python"}`,
		``,
	} {
		if _, err := Parse(bad, testRules); err == nil {
			t.Errorf("profile %s accepted", bad)
		}
	}
}

// Without {heap_mb} the command line does not depend on the memory limit,
// and the default heap share and floor apply to one that does.
func TestLaunchArgsDefaults(t *testing.T) {
	t.Parallel()
	p := Profile{InterpreterFlags: []string{"-s", "-P"}}
	if p.HeapFlagged() {
		t.Errorf("flags without {heap_mb} are heap-flagged")
	}
	if got := strings.Join(p.LaunchArgs([]string{"python3", "launch.py"}, 512), " "); got != "python3 -s -P launch.py" {
		t.Errorf("launch args %q", got)
	}
	if got := p.LaunchArgs(nil, 512); got != nil {
		t.Errorf("no entrypoint: %q", got)
	}
	p.InterpreterFlags = []string{"--heap={heap_mb}"}
	for mem, want := range map[int64]string{1024: "--heap=768", 8: "--heap=16"} {
		if got := p.LaunchArgs([]string{"node"}, mem); !slices.Equal(got, []string{"node", want}) {
			t.Errorf("memory %d MiB: %q; want %s", mem, got, want)
		}
	}
}

func TestParsePackages(t *testing.T) {
	t.Parallel()
	pk, err := ParsePackages(`{"language":"python","version":"3.11.2","packages":[{"name":"numpy","version":"1.24.2","modules":["numpy"]}]}`)
	if err != nil || pk.Version != "3.11.2" || len(pk.Packages) != 1 || pk.Packages[0].Name != "numpy" {
		t.Fatalf("ParsePackages = %+v, %v", pk, err)
	}
	if pk, err := ParsePackages(""); err != nil || pk.Version != "" || pk.Packages != nil {
		t.Errorf("no label: %+v, %v", pk, err)
	}
	if _, err := ParsePackages("{"); err == nil {
		t.Errorf("a broken list is accepted")
	}
}

// Every recipe's runtime.json is a profile the worker accepts, named as its
// folder.
func TestRecipesParse(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../deploy/images/*/runtime.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no recipes found: %v", err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Parse(string(raw), testRules)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if want := filepath.Base(filepath.Dir(f)); p.Name != want {
			t.Errorf("%s: name %q; want %q", f, p.Name, want)
		}
	}
}
