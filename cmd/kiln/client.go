package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

func init() {
	register("submit", "submit a job (code from FILE, - for stdin)", cmdSubmit)
	register("get", "show a job (and wait for it with --wait)", cmdGet)
	register("run", "run FILE and print its output; exit code mirrors the job's", cmdRun)
}

// clientFlags are the settings shared by the client commands.
type clientFlags struct {
	server string
	apiKey string
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	stringVar(fs, &c.server, "server", "KILN_SERVER", "http://127.0.0.1:8080", "Kiln API URL")
}

// client makes the API's client. A --server that is not an http(s) URL
// is a usage error (errBadServer: exit 2) said plainly; a refused
// connection is reported at once, not retried (a person is waiting).
func (c *clientFlags) client() (*client.Client, error) {
	if err := checkServer(c.server); err != nil {
		return nil, err
	}
	// The key comes from the environment only: flags show up in ps.
	c.apiKey = os.Getenv("KILN_API_KEY")
	opts := []client.Option{client.WithRetry(client.RetryPolicy{RefusedAtOnce: true})}
	if c.apiKey != "" {
		opts = append(opts, client.WithAPIKey(c.apiKey))
	}
	return client.New(c.server, opts...)
}

// errBadServer marks a --server that is not the API's URL.
var errBadServer = errors.New("bad --server")

// checkServer says what is wrong with a --server value, in a person's
// words rather than a URL parser's.
func checkServer(server string) error {
	u, err := url.Parse(server)
	if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		return nil
	}
	hint := "http://" + strings.TrimPrefix(strings.TrimPrefix(server, "//"), "/")
	if err == nil && u.Scheme != "" && u.Scheme != "http" && u.Scheme != "https" && u.Opaque == "" {
		hint = "http://" + u.Host + u.Path
	}
	return fmt.Errorf("%w: %q is not the API's URL; give it with its scheme, e.g. --server %s (or set KILN_SERVER)", errBadServer, server, hint)
}

// specFlags build a job.Spec from a code file and flags.
type specFlags struct {
	runtime string
	stdin   string
	noCache bool
	timeout time.Duration
	memory  int64
	allow   string
	tags    metadataFlags
	env     envFlags
}

func (s *specFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.runtime, "runtime", "", "runtime (default: the server's, python)")
	fs.StringVar(&s.stdin, "stdin", "", "file whose content is the job's stdin (- for this process's stdin)")
	fs.BoolVar(&s.noCache, "no-cache", false, "always run; never answer from the result cache")
	fs.DurationVar(&s.timeout, "timeout", 0, "wall-clock limit of the job (default: the server's)")
	fs.Int64Var(&s.memory, "memory-mb", 0, "memory limit of the job in MiB (default: the server's)")
	fs.StringVar(&s.allow, "allow", "", "hosts the job may reach, comma-separated (api.example.org,*.data.gov:443), within the API key's egress allowance (default: no network)")
	fs.Var(&s.tags, "tag", "KEY=VALUE: a label of the job (its metadata), listed and filtered by kiln list --tag; repeatable")
	fs.Var(&s.env, "env", "NAME=VALUE: a variable of the job's environment; repeatable")
}

func (s *specFlags) spec(file string, args []string) (job.Spec, error) {
	code, err := readCodeInput(file)
	if err != nil {
		return job.Spec{}, err
	}
	spec := job.Spec{Runtime: s.runtime, Code: string(code), Args: args}
	if s.stdin != "" {
		in, err := readCodeInput(s.stdin)
		if err != nil {
			return job.Spec{}, err
		}
		spec.Stdin = string(in)
	}
	if s.noCache {
		spec.Cache = job.CacheOff()
	}
	spec.Limits.TimeoutMS = s.timeout.Milliseconds()
	spec.Limits.MemoryMB = s.memory
	spec.Metadata = job.Metadata(s.tags)
	spec.Env = s.env
	for _, h := range strings.Split(s.allow, ",") {
		if h = strings.TrimSpace(h); h != "" {
			if spec.Network == nil {
				spec.Network = &job.Network{}
			}
			spec.Network.Allow = append(spec.Network.Allow, h)
		}
	}
	return spec, nil
}

func readCodeInput(name string) ([]byte, error) {
	if name == "-" {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return nil, fmt.Errorf("read stdin: %w", err)
		}
		return b, nil
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return b, nil
}

// parseWithPositional parses flags that may come before or after the
// positional arguments ("kiln get ID --wait"); everything after "--" is
// positional.
func parseWithPositional(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func cmdSubmit(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln submit", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kiln submit FILE [flags] [-- ARGS...]")
		fs.PrintDefaults()
	}
	var cf clientFlags
	var sf specFlags
	cf.register(fs)
	sf.register(fs)
	wait := fs.Bool("wait", false, "wait for the result and print it")
	asJSON := fs.Bool("json", false, "print the API's JSON answer")
	idem := fs.String("idempotency-key", "", "Idempotency-Key: retrying with the same key and file answers with the same job")
	pos, err := parseWithPositional(fs, args)
	if err != nil {
		return clientUsageError(err)
	}
	if len(pos) < 1 {
		fs.Usage()
		return 2
	}
	spec, err := sf.spec(pos[0], pos[1:])
	if err != nil {
		return clientFail("submit", err)
	}
	c, err := cf.client()
	if err != nil {
		return clientFail("submit", err)
	}
	var opts []client.SubmitOption
	if *idem != "" {
		opts = append(opts, client.WithIdempotencyKey(*idem))
	}
	sub, err := c.Submit(ctx, spec, opts...)
	if err != nil {
		return clientFail("submit", err)
	}
	v := sub.JobView
	if *wait && !v.Terminal() {
		if v, err = c.Wait(ctx, v.ID); err != nil {
			return clientFail("wait", err)
		}
	}
	return showJob(v, *asJSON)
}

// metadataFlags collect --tag KEY=VALUE.
type metadataFlags job.Metadata

func (m *metadataFlags) String() string {
	var parts []string
	for k, v := range *m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (m *metadataFlags) Set(v string) error {
	k, val, err := job.ParseTag(v)
	if err != nil {
		return err
	}
	if *m == nil {
		*m = metadataFlags{}
	}
	(*m)[k] = val
	return nil
}

// envFlags collect repeated --env NAME=VALUE flags (the server holds them
// to its env rules: reserved names, sizes).
type envFlags map[string]string

func (e *envFlags) String() string {
	names := make([]string, 0, len(*e))
	for k := range *e {
		names = append(names, k+"=…")
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

func (e *envFlags) Set(v string) error {
	name, val, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("--env %q: want NAME=VALUE", v)
	}
	if *e == nil {
		*e = envFlags{}
	}
	(*e)[name] = val
	return nil
}

func cmdGet(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln get", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kiln get ID [flags]")
		fs.PrintDefaults()
	}
	var cf clientFlags
	cf.register(fs)
	wait := fs.Bool("wait", false, "wait until the job has finished")
	asJSON := fs.Bool("json", false, "print the API's JSON answer")
	pos, err := parseWithPositional(fs, args)
	if err != nil {
		return clientUsageError(err)
	}
	if len(pos) != 1 {
		fs.Usage()
		return 2
	}
	c, err := cf.client()
	if err != nil {
		return clientFail("get", err)
	}
	var v client.JobView
	if *wait {
		v, err = c.Wait(ctx, pos[0])
	} else {
		v, err = c.Get(ctx, pos[0], 0)
	}
	if err != nil {
		return clientFail("get", err)
	}
	return showJob(v, *asJSON)
}

// writeOutput writes a stream's exact bytes: the base64 form when the
// program wrote bytes that are not UTF-8, else the text.
func writeOutput(w io.Writer, text, b64 string) {
	if b64 != "" {
		if raw, err := base64.StdEncoding.DecodeString(b64); err == nil {
			_, _ = w.Write(raw)
			return
		}
	}
	_, _ = io.WriteString(w, text)
}

// exitCode mirrors the job: its exit code, or a conventional code saying
// why there is none, after a line on stderr.
func jobExitCode(v client.JobView) int {
	if v.Error != nil && v.Status != job.StatusSucceeded && v.Status != job.StatusFailed {
		fmt.Fprintf(os.Stderr, "kiln: job %s %s: %s\n", v.ID, v.Status, v.Error.Message)
	}
	if v.Stdout != "" && v.StdoutTruncated || v.StderrTruncated {
		fmt.Fprintf(os.Stderr, "kiln: output truncated (%d stdout bytes, %d stderr bytes in total)\n", v.StdoutBytes, v.StderrBytes)
	}
	switch v.Status {
	case job.StatusTimedOut:
		return 124
	case job.StatusOOMKilled:
		return 137
	case job.StatusCanceled:
		return 130
	case job.StatusInternalError:
		return 70
	}
	if v.ExitCode != nil {
		return *v.ExitCode & 0xff
	}
	return 70
}

func printJobView(w io.Writer, v client.JobView) {
	fmt.Fprintf(w, "id:       %s\nstatus:   %s\n", v.ID, v.Status)
	if !v.Terminal() && len(v.Metadata) > 0 {
		fmt.Fprintf(w, "metadata: %s\n", (*metadataFlags)(&v.Metadata).String())
	}
	if v.TraceID != "" {
		fmt.Fprintf(w, "trace_id: %s\n", v.TraceID)
	}
	if v.CacheHit {
		fmt.Fprintln(w, "cache:    hit")
	}
	if v.CancelRequested {
		fmt.Fprintln(w, "cancel:   requested")
	}
	if !v.Terminal() {
		return
	}
	if v.ExitCode != nil {
		fmt.Fprintf(w, "exit:     %d\n", *v.ExitCode)
	}
	if v.Error != nil {
		fmt.Fprintf(w, "error:    %s: %s (retryable: %t)\n", v.Error.Category, v.Error.Message, v.Error.Retryable)
	}
	fmt.Fprintf(w, "time:     wall %d ms, cpu %d ms, queue %d ms, peak memory %d bytes\n", v.WallMS, v.CPUMS, v.QueueMS, v.MemoryPeakBytes)
	if v.Stdout != "" {
		fmt.Fprintf(w, "stdout:\n%s", indentLines(v.Stdout))
	}
	if v.Stderr != "" {
		fmt.Fprintf(w, "stderr:\n%s", indentLines(v.Stderr))
	}
	for i, o := range v.Outputs {
		fmt.Fprintf(w, "output %d: %s (%s)\n", i+1, o.Type, strings.Join(outputTypes(o), ", "))
	}
	if len(v.Metadata) > 0 {
		fmt.Fprintf(w, "metadata: %s\n", (*metadataFlags)(&v.Metadata).String())
	}
}

func indentLines(s string) string {
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	for _, l := range lines {
		if l != "" {
			b.WriteString("  " + l)
		}
	}
	if !strings.HasSuffix(s, "\n") {
		b.WriteString("\n")
	}
	return b.String()
}

func printJobJSON(v any) int {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return clientFail("print", err)
	}
	return 0
}

func clientUsageError(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

// clientFail prints err for a person and returns the exit status: 2 for a
// bad --server, else 1. API errors show the field to fix and when to
// retry; a missing or refused key names KILN_API_KEY; an API that is not
// there is said so, with its address.
func clientFail(op string, err error) int {
	var apiErr *client.Error
	var opErr *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, errBadServer):
		fmt.Fprintf(os.Stderr, "kiln %s: %v\n", op, err)
		return 2
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusUnauthorized:
		if os.Getenv("KILN_API_KEY") == "" {
			fmt.Fprintf(os.Stderr, "kiln %s: the API needs an API key: set KILN_API_KEY to yours (export KILN_API_KEY=...)\n", op)
		} else {
			fmt.Fprintf(os.Stderr, "kiln %s: the API refused the key in KILN_API_KEY: %s\n", op, apiErr.Detail)
		}
	case errors.As(err, &apiErr):
		fmt.Fprintf(os.Stderr, "kiln %s: %s\n", op, apiErr.Detail)
		if apiErr.Field != "" {
			fmt.Fprintf(os.Stderr, "  field: %s\n", apiErr.Field)
		}
		if apiErr.RetryAfter > 0 {
			fmt.Fprintf(os.Stderr, "  retry after %s\n", apiErr.RetryAfter)
		}
	case errors.Is(err, syscall.ECONNREFUSED) && errors.As(err, &opErr) && opErr.Addr != nil:
		fmt.Fprintf(os.Stderr, "kiln %s: nothing answers at %s (connection refused): is the Kiln API running there? Point --server or KILN_SERVER at it\n", op, opErr.Addr)
	case errors.As(err, &dnsErr):
		fmt.Fprintf(os.Stderr, "kiln %s: the API's host %q is not known (%s): check --server or KILN_SERVER\n", op, dnsErr.Name, dnsErr.Err)
	default:
		fmt.Fprintf(os.Stderr, "kiln %s: %v\n", op, err)
	}
	return 1
}

// showJob prints a job for kiln submit and kiln get: the API's JSON, or the
// readable view. The exit status mirrors a finished job's (jobExitCode); a
// job not finished yet is 0.
func showJob(v client.JobView, asJSON bool) int {
	if asJSON {
		if code := printJobJSON(v); code != 0 {
			return code
		}
	} else {
		printJobView(os.Stdout, v)
	}
	if !v.Terminal() {
		return 0
	}
	return jobExitCode(v)
}
