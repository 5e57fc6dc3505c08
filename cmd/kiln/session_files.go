package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// kiln session files: a session's /work from the command line. Reads (ls,
// stat, get) show /work as the session's last call left it; changes (put,
// rm, mkdir, mv) are file operations of the session, ordered with its
// calls.

// sessionFileCommands are kiln session files' subcommands.
var sessionFileCommands = map[string]struct {
	usage, summary string
	args           func(n int) bool // whether n positional arguments (after ID) fit
	run            func(ctx context.Context, s *client.Session, fs *sessionFileFlags, args []string) int
}{
	"ls":    {"ls ID [DIR]", "list /work (or DIR) as the last call left it", func(n int) bool { return n <= 1 }, sessionFilesLs},
	"stat":  {"stat ID PATH", "describe an entry (file, dir or symlink)", func(n int) bool { return n == 1 }, sessionFilesStat},
	"get":   {"get ID PATH", "write a file to stdout (or --output)", func(n int) bool { return n == 1 }, sessionFilesGet},
	"put":   {"put ID LOCAL|- [PATH]", "upload LOCAL (- for stdin) as PATH (default: LOCAL's name)", func(n int) bool { return n == 1 || n == 2 }, sessionFilesPut},
	"rm":    {"rm ID PATH...", "remove entries (a directory with --recursive)", func(n int) bool { return n >= 1 }, sessionFilesRm},
	"mkdir": {"mkdir ID PATH...", "make directories (and their parents)", func(n int) bool { return n >= 1 }, sessionFilesMkdir},
	"mv":    {"mv ID FROM TO", "move (rename) an entry (--overwrite replaces TO)", func(n int) bool { return n == 2 }, sessionFilesMv},
}

// sessionFileFlags are the flags of every files subcommand.
type sessionFileFlags struct {
	cf                         clientFlags
	json, recursive, overwrite bool
	output                     string
	name                       string // "kiln session files ls"
}

func sessionFilesUsage() {
	fmt.Fprintln(os.Stderr, "usage: kiln session files COMMAND ID [ARGS] [flags]\n\nA session's /work: reads show it as the last call left it; changes are done between calls, in order.\n\ncommands:")
	var names []string
	for n := range sessionFileCommands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := sessionFileCommands[n]
		fmt.Fprintf(os.Stderr, "  %-24s %s\n", c.usage, c.summary)
	}
}

func cmdSessionFiles(ctx context.Context, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		sessionFilesUsage()
		return 2
	}
	sub, ok := sessionFileCommands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "kiln session files: unknown command %q\n\n", args[0])
		sessionFilesUsage()
		return 2
	}
	f := &sessionFileFlags{name: "kiln session files " + args[0]}
	fs := flag.NewFlagSet(f.name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kiln session files %s [flags]\n\n%s.\n", sub.usage, sub.summary)
		fs.PrintDefaults()
	}
	f.cf.register(fs)
	switch args[0] {
	case "ls":
		fs.BoolVar(&f.recursive, "recursive", false, "every entry below DIR, not only its own")
		fs.BoolVar(&f.json, "json", false, "print the API's JSON")
	case "stat", "mkdir", "mv", "put":
		fs.BoolVar(&f.json, "json", false, "print the API's JSON")
	case "rm":
		fs.BoolVar(&f.recursive, "recursive", false, "remove a directory and everything in it")
	case "get":
		fs.StringVar(&f.output, "output", "", "write the file here instead of stdout")
	}
	if args[0] == "mv" {
		fs.BoolVar(&f.overwrite, "overwrite", false, "replace what is at TO")
	}
	pos, err := parseWithPositional(fs, args[1:])
	if err != nil {
		return clientUsageError(err)
	}
	if len(pos) < 1 || !sub.args(len(pos)-1) {
		fs.Usage()
		return 2
	}
	s, fail := openSession(ctx, f.cf, pos[0], f.op())
	if s == nil {
		return fail
	}
	return sub.run(ctx, s, f, pos[1:])
}

func (f *sessionFileFlags) op() string { return strings.TrimPrefix(f.name, "kiln ") }

// printEntry prints one entry as ls -l does, or its JSON.
func (f *sessionFileFlags) printEntry(e job.SessionFileInfo) int {
	if f.json {
		return printJobJSON(e)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	printEntryRow(tw, e)
	_ = tw.Flush()
	return 0
}

func printEntryRow(tw *tabwriter.Writer, e job.SessionFileInfo) {
	name := e.Path
	if e.Type == job.FileTypeDir {
		name += "/"
	}
	fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", e.Type, e.Mode, e.Size, e.MTime.UTC().Format(time.RFC3339), name)
}

func sessionFilesLs(ctx context.Context, s *client.Session, f *sessionFileFlags, args []string) int {
	dir := ""
	if len(args) == 1 {
		dir = strings.TrimSuffix(args[0], "/")
	}
	entries, err := s.ListFiles(ctx, dir, f.recursive)
	if err != nil {
		return clientFail(f.op(), err)
	}
	if f.json {
		return printJobJSON(job.SessionFileList{Path: dir, Entries: entries})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tMODE\tSIZE\tMTIME\tPATH")
	for _, e := range entries {
		printEntryRow(tw, e)
	}
	_ = tw.Flush()
	return 0
}

func sessionFilesStat(ctx context.Context, s *client.Session, f *sessionFileFlags, args []string) int {
	e, err := s.StatFile(ctx, args[0])
	if err != nil {
		return clientFail(f.op(), err)
	}
	return f.printEntry(e)
}

func sessionFilesGet(ctx context.Context, s *client.Session, f *sessionFileFlags, args []string) int {
	b, err := s.ReadFile(ctx, args[0])
	if err != nil {
		return clientFail(f.op(), err)
	}
	if f.output != "" {
		if err := os.WriteFile(f.output, b, 0o644); err != nil {
			return clientFail(f.op(), err)
		}
		return 0
	}
	_, _ = os.Stdout.Write(b)
	return 0
}

func sessionFilesPut(ctx context.Context, s *client.Session, f *sessionFileFlags, args []string) int {
	local, name := args[0], path.Base(args[0])
	if len(args) == 2 {
		name = args[1]
	} else if local == "-" {
		fmt.Fprintln(os.Stderr, "kiln session files put: name the file's PATH in /work when it comes from stdin")
		return 2
	}
	b, err := readCodeInput(local)
	if err != nil {
		return clientFail(f.op(), err)
	}
	e, err := s.WriteFile(ctx, name, b)
	if err != nil {
		return clientFail(f.op(), err)
	}
	if f.json {
		return printJobJSON(e)
	}
	fmt.Fprintf(os.Stderr, "kiln session files put: wrote %s (%d bytes)\n", e.Path, e.Size)
	return 0
}

func sessionFilesRm(ctx context.Context, s *client.Session, f *sessionFileFlags, args []string) int {
	code := 0
	for _, name := range args {
		if err := s.RemoveFile(ctx, name, f.recursive); err != nil {
			code = clientFail(f.op()+" "+name, err)
		}
	}
	return code
}

func sessionFilesMkdir(ctx context.Context, s *client.Session, f *sessionFileFlags, args []string) int {
	code := 0
	for _, name := range args {
		e, err := s.Mkdir(ctx, name)
		if err != nil {
			code = clientFail(f.op()+" "+name, err)
			continue
		}
		if f.json {
			if c := printJobJSON(e); c != 0 {
				code = c
			}
		}
	}
	return code
}

func sessionFilesMv(ctx context.Context, s *client.Session, f *sessionFileFlags, args []string) int {
	e, err := s.MoveFile(ctx, args[0], args[1], f.overwrite)
	if err != nil {
		return clientFail(f.op(), err)
	}
	if f.json {
		return printJobJSON(e)
	}
	return 0
}
