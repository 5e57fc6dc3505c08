package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// configurationDoc is the page that documents every command's flags.
const configurationDoc = "../../docs/configuration.md"

// flagLine matches a flag in a FlagSet's PrintDefaults output: two spaces,
// a dash, the name, then its type or the end of the line.
var flagLine = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9._-]*)(?: |$)`)

// docFlagRow matches a flag named in the first column of a table row of the
// configuration page.
var docFlagRow = regexp.MustCompile("(?m)^\\| `--([A-Za-z0-9][A-Za-z0-9._-]*)`")

// commandFlags returns the flags each registered command defines, read from
// what the command prints for -h: the flag sets are built inside each
// command, so asking for help is how a test sees them without starting
// anything.
func commandFlags(t *testing.T) map[string][]string {
	t.Helper()
	// kiln exec sets GOMAXPROCS to 1 unless the variable is set.
	t.Setenv("GOMAXPROCS", strconv.Itoa(runtime.GOMAXPROCS(0)))
	out := map[string][]string{}
	runs := map[string]func(context.Context, []string) int{}
	for name, cmd := range commands {
		runs[name] = cmd.run
	}
	// kiln session is a group: its subcommands have the flags.
	delete(runs, "session")
	for name, sub := range sessionCommands {
		runs["session "+name] = sub.run
	}
	// So is kiln session files.
	delete(runs, "session files")
	for name := range sessionFileCommands {
		runs["session files "+name] = func(ctx context.Context, args []string) int {
			return cmdSessionFiles(ctx, append([]string{name}, args...))
		}
	}
	for name, run := range runs {
		help := captureStderr(t, func() { run(context.Background(), []string{"-h"}) })
		var flags []string
		for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
			flags = append(flags, m[1])
		}
		if len(flags) == 0 {
			t.Fatalf("kiln %s -h listed no flags; output:\n%s", name, help)
		}
		sort.Strings(flags)
		out[name] = flags
	}
	return out
}

func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	defer func() { os.Stderr = saved }()
	f()
	os.Stderr = saved
	w.Close()
	b := <-done
	r.Close()
	return string(b)
}

// TestConfigurationDocumentsEveryFlag fails when a flag of any kiln command
// is missing from docs/configuration.md, or when the page's tables name a
// flag no command has.
func TestConfigurationDocumentsEveryFlag(t *testing.T) {
	doc, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	flags := commandFlags(t)
	for _, want := range []struct{ cmd, flag string }{{"worker", "box-max"}, {"api", "addr"}, {"mcp", "sessions"}, {"run", "out"}, {"session new", "tag"}} {
		if !contains(flags[want.cmd], want.flag) {
			t.Fatalf("kiln %s: flag --%s not found among %v: the help output is not read as expected", want.cmd, want.flag, flags[want.cmd])
		}
	}

	known := map[string]bool{}
	var missing []string
	names := make([]string, 0, len(flags))
	for name := range flags {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, f := range flags[name] {
			known[f] = true
			if !bytes.Contains(doc, []byte("`--"+f+"`")) {
				missing = append(missing, "kiln "+name+" --"+f)
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("%s does not document these flags (as `--name`):\n  %s", configurationDoc, strings.Join(missing, "\n  "))
	}

	var unknown []string
	for _, m := range docFlagRow.FindAllSubmatch(doc, -1) {
		if f := string(m[1]); !known[f] {
			unknown = append(unknown, "--"+f)
		}
	}
	if len(unknown) > 0 {
		t.Errorf("%s documents flags no kiln command has: %s", configurationDoc, strings.Join(unknown, ", "))
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
