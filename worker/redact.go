package worker

import (
	"context"
	"log/slog"
	"maps"
	"strconv"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
)

// detector returns the redaction detector of m's tenant policy. A policy
// the worker cannot use (the API checks it when it reads the key file, so
// only a bug gets here) falls back to the built-in detectors: output is
// never left unredacted because of it.
func (w *Worker) detector(ctx context.Context, log *slog.Logger, m job.Message) *redact.Detector {
	d, err := redact.New(m.Redact)
	if err != nil {
		log.ErrorContext(ctx, "the job's redaction policy is unusable; redacting with the built-in detectors only", slog.Any("error", err))
		d, _ = redact.New(nil)
	}
	return d
}

// redactResult replaces key-like strings in everything of r that carries
// the program's words: stdout, stderr, the error message and artifact
// names; r.Redactions counts them. It runs before the result is stored,
// cached, sent to live viewers or a callback, or logged.
func redactResult(d *redact.Detector, r *job.Result) {
	if d.Off() {
		return
	}
	counts := redact.Counts{}
	stream := func(text, b64 string) (string, string) {
		raw, err := job.RawOutput(text, b64)
		if err != nil {
			raw = []byte(text)
		}
		out, c := d.Redact(raw)
		if c == nil {
			return text, b64
		}
		counts.Add(c)
		var tmp job.Result
		tmp.SetOutput(out, nil)
		return tmp.Stdout, tmp.StdoutBase64
	}
	r.Stdout, r.StdoutBase64 = stream(r.Stdout, r.StdoutBase64)
	r.Stderr, r.StderrBase64 = stream(r.Stderr, r.StderrBase64)
	str := func(s *string) {
		out, c := d.String(*s)
		if c != nil {
			counts.Add(c)
			*s = out
		}
	}
	if r.Error != nil {
		str(&r.Error.Message)
	}
	for i := range r.Artifacts {
		str(&r.Artifacts[i].Name)
	}
	for i := range r.ArtifactsSkipped {
		str(&r.ArtifactsSkipped[i].Name)
	}
	uniqueNames(r.Artifacts)
	if len(counts) > 0 {
		if r.Redactions == nil {
			r.Redactions = map[string]int{}
		}
		maps.Copy(r.Redactions, counts)
	}
}

// uniqueNames keeps artifact names distinct (they name downloads) when two
// redacted names came out the same: later ones get "~2", "~3", ...
func uniqueNames(as []job.Artifact) {
	seen := make(map[string]bool, len(as))
	for i := range as {
		name := as[i].Name
		for n := 2; seen[name]; n++ {
			name = as[i].Name + "~" + strconv.Itoa(n)
		}
		as[i].Name = name
		seen[name] = true
	}
}
