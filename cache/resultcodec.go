package cache

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kilnrun/kiln/job"
)

// A stored Result is a compact frame rather than the Result's JSON: output
// bytes go in as they are, so a stream of control bytes costs one byte a
// byte rather than six ("\u0001"), and the value's size is bounded:
//
//	"K1" uvarint(len(meta)) meta uvarint(len(stdout)) stdout uvarint(len(stderr)) stderr
//
// meta is the Result's JSON without its output text (storedMeta), stdout and
// stderr the streams' exact bytes. A stream longer than
// job.MaxInlineOutputBytes is not in the frame: the worker keeps it in the
// object store and meta names it. Values written before the frame existed
// (plain Result JSON, starting with '{') still decode.
const resultFrameMagic = "K1"

// MaxResultValueBytes bounds one stored Result value (a job record's result
// field or a result-cache entry): two inline streams of at most
// job.MaxInlineOutputBytes and the metadata (status, error, limits, the
// artifact list). A Result over it is refused with ErrValueTooLarge rather
// than written.
const MaxResultValueBytes = 512 << 10

// ErrValueTooLarge is returned for a Result whose stored form would exceed
// MaxResultValueBytes (its output should have gone to the object store).
var ErrValueTooLarge = errors.New("cache: stored result over its size bound")

// storedMeta is the frame's JSON part: the Result (whose output text is
// moved to the frame) and the object-store locations of spilled streams,
// which a Result's own JSON leaves out.
type storedMeta struct {
	*job.Result
	StdoutObject *job.OutputObject `json:"stdout_object,omitempty"`
	StderrObject *job.OutputObject `json:"stderr_object,omitempty"`
}

// encodeResult returns res's stored form.
func encodeResult(res job.Result) ([]byte, error) {
	stdout, err := job.RawOutput(res.Stdout, res.StdoutBase64)
	if err != nil {
		return nil, fmt.Errorf("encode result: stdout_base64: %w", err)
	}
	stderr, err := job.RawOutput(res.Stderr, res.StderrBase64)
	if err != nil {
		return nil, fmt.Errorf("encode result: stderr_base64: %w", err)
	}
	meta := storedMeta{Result: &res, StdoutObject: res.StdoutObject, StderrObject: res.StderrObject}
	res.Stdout, res.Stderr, res.StdoutBase64, res.StderrBase64 = "", "", "", ""
	var mb bytes.Buffer
	enc := json.NewEncoder(&mb)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(meta); err != nil {
		return nil, fmt.Errorf("encode result: %w", err)
	}
	m := bytes.TrimSuffix(mb.Bytes(), []byte("\n"))
	size := len(resultFrameMagic) + 3*binary.MaxVarintLen64 + len(m) + len(stdout) + len(stderr)
	if size > MaxResultValueBytes {
		return nil, fmt.Errorf("encode result: %d bytes of metadata, %d of stdout and %d of stderr inline, over %d: %w",
			len(m), len(stdout), len(stderr), MaxResultValueBytes, ErrValueTooLarge)
	}
	b := make([]byte, 0, size)
	b = append(b, resultFrameMagic...)
	for _, part := range [][]byte{m, stdout, stderr} {
		b = binary.AppendUvarint(b, uint64(len(part)))
		b = append(b, part...)
	}
	return b, nil
}

// decodeResult reads a stored Result: a frame, or the plain JSON of older values.
func decodeResult(b []byte) (job.Result, error) {
	var res job.Result
	if !bytes.HasPrefix(b, []byte(resultFrameMagic)) {
		if err := json.Unmarshal(b, &res); err != nil {
			return job.Result{}, fmt.Errorf("decode result: %w", err)
		}
		return res, nil
	}
	rest := b[len(resultFrameMagic):]
	parts := make([][]byte, 3)
	for i := range parts {
		n, k := binary.Uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k) {
			return job.Result{}, fmt.Errorf("decode result: frame part %d is cut short", i)
		}
		parts[i], rest = rest[k:k+int(n)], rest[k+int(n):]
	}
	if len(rest) != 0 {
		return job.Result{}, fmt.Errorf("decode result: %d bytes after the frame", len(rest))
	}
	meta := storedMeta{Result: &res}
	if err := json.Unmarshal(parts[0], &meta); err != nil {
		return job.Result{}, fmt.Errorf("decode result metadata: %w", err)
	}
	stdoutObj, stderrObj := meta.StdoutObject, meta.StderrObject
	res.SetOutput(parts[1], parts[2])
	res.StdoutObject, res.StderrObject = stdoutObj, stderrObj
	return res, nil
}
