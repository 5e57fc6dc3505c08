package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

func init() {
	register("session", "sessions: an interpreter and its files kept between calls (new, exec, files, rm, ls)", cmdSession)
}

// sessionCommands are kiln session's subcommands.
var sessionCommands = map[string]struct {
	summary string
	run     func(ctx context.Context, args []string) int
}{
	"new":    {"make a session; prints its id", cmdSessionNew},
	"exec":   {"run FILE (or --code) as the session's next call; exit code mirrors the call's", cmdSessionExec},
	"cancel": {"cancel call SEQ of a session (withdrawn if it waits, interrupted if it runs); prints its status", cmdSessionCancel},
	"files":  {"the session's /work: ls, stat, get, put, rm, mkdir, mv", cmdSessionFiles},
	"rm":     {"end sessions", cmdSessionRm},
	"pause":  {"free sessions' sandboxes and memory, keeping their files (resume, or a call, brings one back)", cmdSessionPause},
	"resume": {"bring paused sessions back; says what came back (files+variables, files, files+replay)", cmdSessionResume},
	"ls":     {"list your live sessions", cmdSessionLs},
}

func sessionUsage() {
	fmt.Fprintln(os.Stderr, "usage: kiln session COMMAND [flags]\n\nA session keeps one sandbox's interpreter (variables, imports) and /work between calls:\n\n  S=$(kiln session new)\n  kiln session exec $S --code 'x = 41'\n  kiln session exec $S --code 'print(x + 1)'\n  kiln session rm $S\n\ncommands:")
	var names []string
	for n := range sessionCommands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-7s %s\n", n, sessionCommands[n].summary)
	}
}

func cmdSession(ctx context.Context, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		sessionUsage()
		return 2
	}
	sub, ok := sessionCommands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "kiln session: unknown command %q\n\n", args[0])
		sessionUsage()
		return 2
	}
	return sub.run(ctx, args[1:])
}

func cmdSessionNew(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln session new", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	var spec job.SessionSpec
	var tags metadataFlags
	var env envFlags
	var files fileFlags
	fs.StringVar(&spec.Runtime, "runtime", "", "runtime (default: the server's, python)")
	fs.Int64Var(&spec.MemoryMB, "memory-mb", 0, "the session's memory, every call together, in MiB (default: the server's)")
	idle := fs.Duration("idle-timeout", 0, "end the session this long after its last call (default: the server's, 10m)")
	life := fs.Duration("max-lifetime", 0, "end the session this long after it was made (default: the server's, 1h)")
	fs.StringVar(&spec.Restore, "restore", "", "what a session brings back when its worker is lost: files (default) or replay")
	fs.Var(&tags, "tag", "KEY=VALUE: a label of the session (its metadata); repeatable")
	fs.Var(&env, "env", "NAME=VALUE: a variable of every call's and command's environment (a call's own --env wins); repeatable")
	fs.Var(&files, "file", "local[:name]: place a local file in /work before the first call; repeatable")
	asJSON := fs.Bool("json", false, "print the API's JSON answer, not only the id")
	pos, err := parseWithPositional(fs, args)
	if err != nil {
		return clientUsageError(err)
	}
	if len(pos) != 0 {
		fs.Usage()
		return 2
	}
	spec.IdleTimeoutS, spec.MaxLifetimeS = int64(idle.Seconds()), int64(life.Seconds())
	spec.Metadata, spec.Env = job.Metadata(tags), env
	if spec.Files, err = files.load(); err != nil {
		return clientFail("session new", err)
	}
	c, err := cf.client()
	if err != nil {
		return clientFail("session new", err)
	}
	s, err := c.CreateSession(ctx, spec)
	if err != nil {
		return clientFail("session new", err)
	}
	if *asJSON {
		return printJobJSON(s.Session)
	}
	fmt.Println(s.ID)
	return 0
}

func cmdSessionExec(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln session exec", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kiln session exec ID FILE|- [flags] [-- ARGS...]\n       kiln session exec ID --code CODE [flags]\n       kiln session exec ID --cmd 'SHELL LINE' [--timeout D | --background [--open-stdin]]\n       kiln session exec ID --command-wait CID [--wait D] | --command-kill CID\n       kiln session exec ID --command-stdin CID [--data TEXT] [--close]\n       kiln session exec ID --command-list\n\nRuns the code (or a shell command line, in /work) as the session's next call: prints its\nstdout, stderr and display outputs (as kiln run does), and exits with its exit code. A\nbackground command prints its id; --command-wait prints what it wrote so far and exits\nwith its exit code once it has ended (0 while it runs, saying so on stderr).\n--command-stdin writes --data (else this process's stdin, to its end) to the stdin of a\ncommand started with --open-stdin, then closes it with --close. --command-list prints\none line per background command: its id, running or its exit code, its command line.")
		fs.PrintDefaults()
	}
	var cf clientFlags
	cf.register(fs)
	code := fs.String("code", "", "the call's code (instead of FILE)")
	stdin := fs.String("stdin", "", "file whose content is the call's stdin (- for this process's stdin)")
	timeout := fs.Duration("timeout", 0, "wall-clock limit of the call (default: the session's)")
	out := fs.String("out", "", "directory to save the call's display outputs in (output-N.<ext>)")
	asJSON := fs.Bool("json", false, "print the API's JSON answer")
	shell := fs.String("cmd", "", "a shell command line to run in the session's /work (instead of code)")
	background := fs.Bool("background", false, "with --cmd: start the command and print its id")
	waitCmd := fs.String("command-wait", "", "wait for background command CID (see --wait) and print its output so far")
	wait := fs.Duration("wait", 0, "with --command-wait: how long to wait for the command to end (at most 1m)")
	killCmd := fs.String("command-kill", "", "kill background command CID")
	openStdin := fs.Bool("open-stdin", false, "with --cmd --background: keep the command's stdin open for --command-stdin")
	stdinCmd := fs.String("command-stdin", "", "write to the stdin of background command CID (--data, else this process's stdin)")
	data := fs.String("data", "", "with --command-stdin: the text to write (default: this process's stdin, to its end)")
	closeStdin := fs.Bool("close", false, "with --command-stdin: close the command's stdin after the write")
	listCmds := fs.Bool("command-list", false, "list the session's background commands: id, running or exit code, command line")
	var env envFlags
	fs.Var(&env, "env", "NAME=VALUE: a variable of the call's (or --cmd's) environment, over the session's; repeatable")
	pos, err := parseWithPositional(fs, args)
	if err != nil {
		return clientUsageError(err)
	}
	if *shell != "" || *waitCmd != "" || *killCmd != "" || *stdinCmd != "" || *listCmds {
		if len(pos) != 1 {
			fs.Usage()
			return 2
		}
		op := commandOp{req: job.CommandRequest{Cmd: *shell, Background: *background, Stdin: *openStdin, TimeoutS: int(timeout.Seconds()), Env: env},
			waitID: *waitCmd, wait: *wait, killID: *killCmd, stdinID: *stdinCmd, close: *closeStdin, list: *listCmds, asJSON: *asJSON}
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "data" {
				op.data = data
			}
		})
		return sessionCommand(ctx, cf, pos[0], op)
	}
	if len(pos) < 1 || (*code == "" && len(pos) < 2) {
		fs.Usage()
		return 2
	}
	call := job.SessionCall{Code: *code, Env: env}
	rest := pos[1:]
	if *code == "" {
		b, err := readCodeInput(pos[1])
		if err != nil {
			return clientFail("session exec", err)
		}
		call.Code, rest = string(b), pos[2:]
	}
	call.Args = rest
	if *stdin != "" {
		b, err := readCodeInput(*stdin)
		if err != nil {
			return clientFail("session exec", err)
		}
		call.Stdin = string(b)
	}
	call.Limits.TimeoutMS = timeout.Milliseconds()
	s, fail := openSession(ctx, cf, pos[0], "session exec")
	if s == nil {
		return fail
	}
	res, err := s.Exec(ctx, call)
	if err != nil {
		return clientFail("session exec", err)
	}
	if *asJSON {
		if code := printJobJSON(res); code != 0 {
			return code
		}
	} else {
		writeOutput(os.Stdout, res.Stdout, res.StdoutBase64)
		writeOutput(os.Stderr, res.Stderr, res.StderrBase64)
		// Display outputs too long to carry inline are artifacts of the
		// call's result id, which a session call does not keep: none here.
		if err := showOutputs(ctx, nil, os.Stdout, res.ID, res.Outputs, *out, "kiln session exec"); err != nil {
			fmt.Fprintf(os.Stderr, "kiln session exec: %v\n", err)
		}
		if !res.StateRestored && res.SessionNote != "" {
			fmt.Fprintf(os.Stderr, "kiln session exec: %s\n", res.SessionNote)
		}
	}
	return jobExitCode(client.JobView{Result: res.Result})
}

func cmdSessionRm(ctx context.Context, args []string) int {
	return eachSession(ctx, "rm", args, func(ctx context.Context, s *client.Session) (string, error) {
		if err := s.Close(ctx); err != nil {
			return "", err
		}
		return "ended", nil
	})
}

// openSession opens session id with cf's client; when it cannot, it says
// why as kiln op and returns nil and the exit code to end with.
func openSession(ctx context.Context, cf clientFlags, id, op string) (*client.Session, int) {
	c, err := cf.client()
	if err == nil {
		var s *client.Session
		if s, err = c.OpenSession(ctx, id); err == nil {
			return s, 0
		}
	}
	return nil, clientFail(op, err)
}

// cmdSessionCancel is kiln session cancel ID SEQ: the call's status once it
// has ended (canceled, or what it ended as first); the exit code mirrors
// the call's.
func cmdSessionCancel(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln session cancel", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print the API's JSON answer")
	pos, err := parseWithPositional(fs, args)
	if err != nil {
		return clientUsageError(err)
	}
	var seq int64
	if len(pos) == 2 {
		seq, err = strconv.ParseInt(pos[1], 10, 64)
	}
	if len(pos) != 2 || err != nil || seq < 1 {
		fmt.Fprintln(os.Stderr, "usage: kiln session cancel ID SEQ\n\nCancels call SEQ of session ID (a call's seq is in its answer, and in kiln session exec --json):\na call still waiting behind the session's earlier calls is withdrawn and never runs, a running\none is interrupted (the interpreter and its variables stay), one that ended is left as it is.\nWaits for the call to end and prints its status.")
		return 2
	}
	s, fail := openSession(ctx, cf, pos[0], "session cancel")
	if s == nil {
		return fail
	}
	res, err := s.CancelCall(ctx, seq)
	if err != nil {
		return clientFail("session cancel", err)
	}
	if *asJSON {
		if code := printJobJSON(res); code != 0 {
			return code
		}
	} else {
		fmt.Printf("%s call %d %s\n", s.ID, res.Seq, res.Status)
	}
	return jobExitCode(client.JobView{Result: res.Result})
}

func cmdSessionPause(ctx context.Context, args []string) int {
	return eachSession(ctx, "pause", args, func(ctx context.Context, s *client.Session) (string, error) {
		if err := s.Pause(ctx); err != nil {
			return "", err
		}
		return string(s.Status), nil
	})
}

func cmdSessionResume(ctx context.Context, args []string) int {
	return eachSession(ctx, "resume", args, func(ctx context.Context, s *client.Session) (string, error) {
		if err := s.Resume(ctx); err != nil {
			return "", err
		}
		if s.Restored == "" {
			return string(s.Status), nil
		}
		return fmt.Sprintf("%s (restored: %s)", s.Status, s.Restored), nil
	})
}

// eachSession does kiln session NAME ID...: op on each session, printing
// "ID what-op-said" or the error; the exit code is the last failure's.
func eachSession(ctx context.Context, name string, args []string, op func(context.Context, *client.Session) (string, error)) int {
	fs := flag.NewFlagSet("kiln session "+name, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	pos, err := parseWithPositional(fs, args)
	if err != nil {
		return clientUsageError(err)
	}
	if len(pos) == 0 {
		fmt.Fprintf(os.Stderr, "usage: kiln session %s ID...\n", name)
		return 2
	}
	c, err := cf.client()
	if err != nil {
		return clientFail("session "+name, err)
	}
	code := 0
	for _, id := range pos {
		s, err := c.OpenSession(ctx, id)
		var said string
		if err == nil {
			said, err = op(ctx, s)
		}
		if err != nil {
			code = clientFail("session "+name+" "+id, err)
			continue
		}
		fmt.Printf("%s %s\n", id, said)
	}
	return code
}

func cmdSessionLs(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln session ls", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	var tags metadataFlags
	fs.Var(&tags, "tag", "KEY=VALUE: only sessions whose metadata holds it; repeatable")
	asJSON := fs.Bool("json", false, "print the API's JSON")
	if _, err := parseWithPositional(fs, args); err != nil {
		return clientUsageError(err)
	}
	c, err := cf.client()
	if err != nil {
		return clientFail("session ls", err)
	}
	var filter []string
	for k, v := range tags {
		filter = append(filter, k+"="+v)
	}
	ss, err := c.Sessions(ctx, filter...)
	if err != nil {
		return clientFail("session ls", err)
	}
	if *asJSON {
		return printJobJSON(map[string]any{"sessions": ss})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tRUNTIME\tCALLS\tEXPIRES\tMETADATA")
	for _, s := range ss {
		md := metadataFlags(s.Metadata)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", s.ID, s.Status, s.Runtime, s.Calls, s.ExpiresAt.UTC().Format(time.RFC3339), strings.TrimSpace(md.String()))
	}
	_ = tw.Flush()
	return 0
}
