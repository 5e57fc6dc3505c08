package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	ktrace "github.com/kilnrun/kiln/trace"
)

// Every setting of every command is a flag and a KILN_* environment
// variable; the flag wins. The variable's name is kept at the end of the
// flag's usage text ("... [$KILN_ADDR]"), which both documents it in -h and
// lets parseFlags find it, so a command needs no other bookkeeping:
//
//	fs := flag.NewFlagSet("api", flag.ContinueOnError)
//	stringVar(fs, &cfg.Addr, "addr", "KILN_ADDR", "127.0.0.1:8080", "listen address")
//	if err := parseFlags(fs, args); err != nil { ... }

const envOpen, envClose = " [$", "]"

func withEnv(usage, env string) string {
	if env == "" {
		return usage
	}
	return usage + envOpen + env + envClose
}

func stringVar(fs *flag.FlagSet, p *string, name, env, def, usage string) {
	fs.StringVar(p, name, def, withEnv(usage, env))
}

func durationVar(fs *flag.FlagSet, p *time.Duration, name, env string, def time.Duration, usage string) {
	fs.DurationVar(p, name, def, withEnv(usage, env))
}

func intVar(fs *flag.FlagSet, p *int, name, env string, def int, usage string) {
	fs.IntVar(p, name, def, withEnv(usage, env))
}

func int64Var(fs *flag.FlagSet, p *int64, name, env string, def int64, usage string) {
	fs.Int64Var(p, name, def, withEnv(usage, env))
}

func boolVar(fs *flag.FlagSet, p *bool, name, env string, def bool, usage string) {
	fs.BoolVar(p, name, def, withEnv(usage, env))
}

// envName returns the variable named at the end of a usage text, or "".
func envName(usage string) string {
	i := strings.LastIndex(usage, envOpen)
	if i < 0 || !strings.HasSuffix(usage, envClose) {
		return ""
	}
	return usage[i+len(envOpen) : len(usage)-len(envClose)]
}

// parseFlags parses args, then gives every flag not set on the command line
// the value of its environment variable, if that is set. A variable that
// does not parse is an error naming it.
func parseFlags(fs *flag.FlagSet, args []string) error {
	return parseFlagsEnv(fs, args, os.LookupEnv)
}

func parseFlagsEnv(fs *flag.FlagSet, args []string, lookup func(string) (string, bool)) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		env := envName(f.Usage)
		if set[f.Name] || env == "" {
			return
		}
		if v, ok := lookup(env); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("$%s=%q (for --%s): %w", env, v, f.Name, err))
			}
		}
	})
	return errors.Join(errs...)
}

// newLogger parses a --log-level value and returns the JSON, trace-aware logger;
// the error message names the command and the accepted values.
func newLogger(cmd, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("kiln %s: --log-level %q: use debug, info, warn or error", cmd, level)
	}
	return ktrace.NewLogger(os.Stderr, l), nil
}
