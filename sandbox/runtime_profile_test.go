package sandbox

import (
	"strings"
	"testing"
)

func TestRuntimeProfile(t *testing.T) {
	t.Parallel()
	p, err := parseProfile(`{"name":"node","language":"javascript","main_file":"main.js","reserved_files":["main.mjs"],
		"interpreter_flags":["--max-old-space-size={heap_mb}"],"heap_percent":60,"env":["NODE_DISABLE_COLORS=1"],
		"reserved_env":["NODE_OPTIONS"],"classifier":"node","preload":[],"limits":{"memory_mb":512}}`)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(p.launchArgs([]string{"node", "/usr/lib/kiln/launch.js"}, 256), " ")
	if got != "node --max-old-space-size=153 /usr/lib/kiln/launch.js" {
		t.Fatalf("launch args %q", got)
	}
	c := p.contract(imagePackages{Version: "18.20.4"})
	if c.MainFile != "main.js" || c.Version != "18.20.4" || strings.Join(c.ReservedEnv, ",") != "NODE_DISABLE_COLORS,NODE_OPTIONS" || c.DefaultLimits.MemoryMB != 512 {
		t.Fatalf("contract %+v", c)
	}
	for _, bad := range []string{
		`{"name":"x","language":"x","main_file":"main.x","classifier":"cobol"}`,
		`{"name":"x","language":"x","main_file":"../main.x","classifier":"python"}`,
		`{"name":"x","language":"x","main_file":"main.x","classifier":"python","env":["PATH=/evil"]}`,
		`{"name":"x","language":"x","main_file":"main.x","classifier":"python","surprise":1}`,
		``,
	} {
		if _, err := parseProfile(bad); err == nil {
			t.Errorf("profile %s accepted", bad)
		}
	}
}

func TestImagesFor(t *testing.T) {
	t.Parallel()
	got, err := ImagesFor([]string{"python", " node ", "custom=registry.local/x:1"})
	if err != nil {
		t.Fatal(err)
	}
	if got["python"] != "kiln.local/python:latest" || got["node"] != "kiln.local/node:latest" || got["custom"] != "registry.local/x:1" {
		t.Fatalf("ImagesFor = %v", got)
	}
	for _, bad := range [][]string{{"py.thon"}, {"python", "python"}, {""}, {"Py"}} {
		if _, err := ImagesFor(bad); err == nil {
			t.Errorf("ImagesFor(%q) accepted", bad)
		}
	}
}
