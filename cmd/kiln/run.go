package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// runCancelGrace is how long kiln run waits, after an interrupt, for the
// canceled job's final result.
const runCancelGrace = 30 * time.Second

// fileFlags collect --file local[:name].
type fileFlags []string

func (f *fileFlags) String() string     { return strings.Join(*f, ",") }
func (f *fileFlags) Set(v string) error { *f = append(*f, v); return nil }

// load reads each local file into a job.File, named as given after ":" or
// by its base name.
func (f fileFlags) load() ([]job.File, error) {
	var files []job.File
	for _, v := range f {
		local, name, ok := strings.Cut(v, ":")
		if !ok || name == "" {
			name = filepath.Base(local)
		}
		b, err := os.ReadFile(local)
		if err != nil {
			return nil, fmt.Errorf("--file %s: %w", v, err)
		}
		jf := job.File{Name: name, Content: string(b)}
		if !utf8.Valid(b) {
			jf.Content, jf.Encoding = base64.StdEncoding.EncodeToString(b), "base64"
		}
		files = append(files, jf)
	}
	return files, nil
}

// cmdRun runs a script: its output printed live from the job's event
// stream, its artifacts downloaded to --out, its exit code mirrored; an
// interrupt cancels the job on the server.
func cmdRun(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln run", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kiln run [flags] FILE|- [-- ARGS...]\n\nRuns FILE (- for stdin) in a sandbox, prints its stdout and stderr as it writes them, then\nits display outputs (the last expression's value, display() calls, figures): their text\nprinted, images, HTML and other types saved to --out as output-N.<ext>. Saves the files it\nleaves in $KILN_OUTPUT_DIR to --out, and exits with its exit code (124 timed out, 137 killed\nfor memory, 130 canceled, 70 internal error). Ctrl-C cancels the job.")
		fs.PrintDefaults()
	}
	var cf clientFlags
	var sf specFlags
	var files fileFlags
	cf.register(fs)
	sf.register(fs)
	fs.Var(&files, "file", "local[:name]: send a local file as the job's input file name (default: its base name); repeatable")
	out := fs.String("out", "", "directory to save the job's artifacts and display outputs (output-N.<ext>) in (default: not saved, only listed)")
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
		return clientFail("run", err)
	}
	if spec.Files, err = files.load(); err != nil {
		return clientFail("run", err)
	}
	c, err := cf.client()
	if err != nil {
		return clientFail("run", err)
	}
	sub, err := c.Submit(ctx, spec)
	if err != nil {
		return clientFail("run", err)
	}
	v := sub.JobView
	var printed [2]int
	if !v.Terminal() {
		v, printed, err = followRun(ctx, c, v)
		if err != nil {
			return clientFail("run", err)
		}
	}
	// What the live stream did not show (a cache hit, events no longer
	// retained) comes from the stored output.
	writeRest(os.Stdout, v.Stdout, v.StdoutBase64, printed[0])
	writeRest(os.Stderr, v.Stderr, v.StderrBase64, printed[1])
	code := jobExitCode(v)
	err = showOutputs(ctx, c, os.Stdout, v.ID, v.Outputs, *out, "kiln run")
	if err == nil {
		err = saveArtifacts(ctx, c, v, *out)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kiln run: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// followRun prints the job's output from its event stream until its result,
// reconnecting after a break. When ctx ends (an interrupt) it cancels the job
// and waits a while for the final result.
func followRun(ctx context.Context, c *client.Client, v client.JobView) (client.JobView, [2]int, error) {
	var printed [2]int
	last := ""
	var final *client.JobView
	onEvent := func(ev client.Event) error {
		last = ev.ID
		switch ev.Type {
		case job.EventStdout, job.EventStderr:
			var o job.OutputEvent
			if err := json.Unmarshal(ev.Data, &o); err != nil {
				return fmt.Errorf("decode %s event: %w", ev.Type, err)
			}
			b, err := o.Bytes()
			if err != nil {
				return fmt.Errorf("decode %s event: %w", ev.Type, err)
			}
			if ev.Type == job.EventStdout {
				_, _ = os.Stdout.Write(b)
				printed[0] += len(b)
			} else {
				_, _ = os.Stderr.Write(b)
				printed[1] += len(b)
			}
		case job.EventOutputSkipped:
			// The live view left bytes out here; the stored output has
			// them. Counted as shown, so the rest printed at the end
			// starts where the live view stopped.
			var sk job.SkippedEvent
			if err := json.Unmarshal(ev.Data, &sk); err != nil {
				return fmt.Errorf("decode %s event: %w", ev.Type, err)
			}
			fmt.Fprintf(os.Stderr, "\nkiln run: %d bytes of %s were written faster than the live view shows; they are in the job's stored output (kiln get %s)\n", sk.Bytes, sk.Stream, v.ID)
			if sk.Stream == job.EventStderr {
				printed[1] += int(sk.Bytes)
			} else {
				printed[0] += int(sk.Bytes)
			}
		case job.EventResult:
			var r client.JobView
			if err := json.Unmarshal(ev.Data, &r); err != nil {
				return fmt.Errorf("decode result event: %w", err)
			}
			final = &r
		}
		return nil
	}
	for attempt := 0; final == nil; attempt++ {
		err := c.Events(ctx, v.ID, last, onEvent)
		if final != nil {
			break
		}
		if ctx.Err() != nil {
			return cancelRun(c, v, printed)
		}
		var apiErr *client.Error
		if errors.As(err, &apiErr) && !apiErr.Temporary() || attempt >= 5 {
			// No event stream: wait for the result the plain way.
			r, werr := c.Wait(ctx, v.ID)
			if ctx.Err() != nil {
				return cancelRun(c, v, printed)
			}
			return r, printed, werr
		}
		select {
		case <-ctx.Done():
			return cancelRun(c, v, printed)
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	return *final, printed, nil
}

// cancelRun cancels the job on the server and returns its final state.
func cancelRun(c *client.Client, v client.JobView, printed [2]int) (client.JobView, [2]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), runCancelGrace)
	defer cancel()
	fmt.Fprintf(os.Stderr, "\nkiln run: interrupted: canceling job %s\n", v.ID)
	if _, err := c.Cancel(ctx, v.ID); err != nil {
		return v, printed, fmt.Errorf("cancel job %s: %w", v.ID, err)
	}
	r, err := c.Wait(ctx, v.ID)
	return r, printed, err
}

// writeRest writes the part of a stream's stored output past the first
// done bytes, which were printed live.
func writeRest(w io.Writer, text, b64 string, done int) {
	b := []byte(text)
	if b64 != "" {
		if raw, err := base64.StdEncoding.DecodeString(b64); err == nil {
			b = raw
		}
	}
	if done < len(b) {
		_, _ = w.Write(b[done:])
	}
}

// saveArtifacts lists the job's artifacts on stderr and, with dir, saves
// each under dir, checked against its SHA-256.
func saveArtifacts(ctx context.Context, c *client.Client, v client.JobView, dir string) error {
	if len(v.ArtifactsSkipped) > 0 {
		fmt.Fprintf(os.Stderr, "kiln run: %d output file(s) not kept (first: %s, %s)\n",
			max(v.ArtifactsSkippedCount, len(v.ArtifactsSkipped)), v.ArtifactsSkipped[0].Name, v.ArtifactsSkipped[0].Reason)
	}
	var files []job.Artifact
	for _, a := range v.Artifacts {
		// A display output's long value: saved as its output-N.
		if !strings.HasPrefix(a.Name, job.OutputArtifactDir+"/") {
			files = append(files, a)
		}
	}
	if dir == "" {
		for _, a := range files {
			fmt.Fprintf(os.Stderr, "kiln run: artifact %s (%d bytes, %s); save with --out DIR\n", a.Name, a.Size, a.ContentType)
		}
		return nil
	}
	for _, a := range files {
		if err := saveArtifact(ctx, c, v.ID, a, dir); err != nil {
			return err
		}
	}
	return nil
}

func saveArtifact(ctx context.Context, c *client.Client, id string, a job.Artifact, dir string) error {
	if !filepath.IsLocal(a.Name) {
		return fmt.Errorf("artifact %q: not a local path; not saved", a.Name)
	}
	dst := filepath.Join(dir, filepath.FromSlash(a.Name))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("artifact %s: %w", a.Name, err)
	}
	body, err := c.Artifact(ctx, id, a.Name)
	if err != nil {
		return fmt.Errorf("download artifact %s: %w", a.Name, err)
	}
	defer body.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".kiln-*")
	if err != nil {
		return fmt.Errorf("artifact %s: %w", a.Name, err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), body)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("download artifact %s: %w", a.Name, err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != a.SHA256 || n != a.Size {
		return fmt.Errorf("artifact %s: got %d bytes with sha256 %s; want %d bytes, %s", a.Name, n, sum, a.Size, a.SHA256)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("artifact %s: %w", a.Name, err)
	}
	fmt.Fprintf(os.Stderr, "kiln run: saved %s (%d bytes)\n", dst, a.Size)
	return nil
}
