package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestSpecFlagsAllow(t *testing.T) {
	t.Parallel()
	code := filepath.Join(t.TempDir(), "job.py")
	if err := os.WriteFile(code, []byte("print(1)"), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) specFlags {
		t.Helper()
		var s specFlags
		fs := flag.NewFlagSet("kiln run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		s.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := parse("--allow", "api.example.org, *.data.gov:443,")
	spec, err := s.spec(code, nil)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Network == nil || !slices.Equal(spec.Network.Allow, []string{"api.example.org", "*.data.gov:443"}) {
		t.Fatalf("--allow: network %+v", spec.Network)
	}
	s = parse()
	if spec, err = s.spec(code, nil); err != nil || spec.Network != nil {
		t.Fatalf("no --allow: network %+v, err %v; want none", spec.Network, err)
	}
}
