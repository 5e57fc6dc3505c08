package job

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
)

// Replay says how a replay's result compares with the result of the job it
// replays (Result.ReplayOf).
type Replay struct {
	// Identical is true when stdout, stderr, the exit code, the signal,
	// the artifacts (names and contents) and the image digest are all the
	// same.
	Identical bool `json:"identical"`
	// Differs names what is not: "stdout", "stderr", "exit_code", "signal",
	// "artifacts", "image_digest", "status".
	Differs []string `json:"differs,omitempty"`
}

// OutputSHA256 is the hex SHA-256 of a result's stdout ("stdout") or stderr
// bytes, whether kept inline or in the object store.
func OutputSHA256(r *Result, stream string) string {
	obj, text, b64 := r.StdoutObject, r.Stdout, r.StdoutBase64
	if stream == "stderr" {
		obj, text, b64 = r.StderrObject, r.Stderr, r.StderrBase64
	}
	if obj != nil {
		return obj.SHA256
	}
	raw, err := RawOutput(text, b64)
	if err != nil {
		raw = []byte(text)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// CompareReplay compares a replay's result with the original's.
func CompareReplay(orig, replay *Result) Replay {
	var d []string
	if orig.Status != replay.Status {
		d = append(d, "status")
	}
	if OutputSHA256(orig, "stdout") != OutputSHA256(replay, "stdout") || orig.StdoutTruncated != replay.StdoutTruncated {
		d = append(d, "stdout")
	}
	if OutputSHA256(orig, "stderr") != OutputSHA256(replay, "stderr") || orig.StderrTruncated != replay.StderrTruncated {
		d = append(d, "stderr")
	}
	if orig.Code() != replay.Code() {
		d = append(d, "exit_code")
	}
	if orig.Signal != replay.Signal {
		d = append(d, "signal")
	}
	key := func(a Artifact) string { return a.Name + "\x00" + a.SHA256 }
	oa, ra := make([]string, len(orig.Artifacts)), make([]string, len(replay.Artifacts))
	for i, a := range orig.Artifacts {
		oa[i] = key(a)
	}
	for i, a := range replay.Artifacts {
		ra[i] = key(a)
	}
	slices.Sort(oa)
	slices.Sort(ra)
	if !slices.Equal(oa, ra) {
		d = append(d, "artifacts")
	}
	if orig.Image.Digest != replay.Image.Digest {
		d = append(d, "image_digest")
	}
	return Replay{Identical: len(d) == 0, Differs: d}
}
