package artifacts

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/job"
)

// Display outputs: the launcher's output channel (initproto.EnvOutputFD),
// one JSON line per output, then the exception, then how many outputs it
// did not write. On the box path the channel is a pipe read while the job
// runs; on the container-per-job paths a host file (bind-mounted into the
// container, opened by kiln-init) read once the job has ended. Nothing of
// it is ever read from stdout: a program that prints an output's encoding
// makes no output.

// OutputStream is what a job's launcher wrote on its output channel, read
// by ReadOutputStream or ReadOutputsFile; the zero value carried nothing.
type OutputStream struct {
	outputs    []job.Output
	exception  *job.Exception
	exceptions int // exception records read (a launcher writes one at most)
	dropped    int
	truncated  bool
}

// channelRecord is one line of the channel: an output, the exception, or
// the count of outputs the launcher did not write.
type channelRecord struct {
	Type      string                     `json:"type"`
	Data      map[string]json.RawMessage `json:"data"`
	Exception *job.Exception             `json:"exception"`
	Dropped   *int                       `json:"dropped"`
}

// ReadOutputStream parses the channel, keeping at most job.MaxOutputsBytes
// of it; with drain, the rest is read and discarded (a pipe's writer must
// never block on a worker that stopped reading).
func ReadOutputStream(r io.Reader, drain bool) OutputStream {
	var st OutputStream
	br := bufio.NewReaderSize(r, 64<<10)
	budget := int64(job.MaxOutputsBytes)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if int64(len(line)+len(chunk)) > budget {
			// Over the channel's bound: nothing more is kept.
			st.truncated = true
			st.dropped++
			if drain {
				_, _ = io.Copy(io.Discard, br)
			}
			return st
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if len(bytes.TrimSpace(line)) > 0 {
			budget -= int64(len(line))
			st.add(line)
		}
		line = line[:0]
		if err != nil {
			return st
		}
	}
}

// add takes one line of the channel.
func (st *OutputStream) add(line []byte) {
	var flattened []string
	if deeperThan(line, job.MaxOutputJSONDepth+2) {
		line, flattened = flattenDeep(line)
	}
	var rec channelRecord
	if err := json.Unmarshal(line, &rec); err != nil {
		st.dropped++
		return
	}
	switch {
	case rec.Exception != nil:
		rec.Exception.Bound()
		st.exception = rec.Exception
		st.exceptions++
	case rec.Dropped != nil:
		st.dropped += min(max(*rec.Dropped, 0), 1<<20)
	default:
		o := job.Output{Type: rec.Type, Data: rec.Data}
		if o.Validate() != nil || len(st.outputs) >= job.MaxOutputs {
			st.dropped++
			return
		}
		o.Flattened = flattened
		st.outputs = append(st.outputs, o)
	}
}

// flattenDeep rewrites a channel record line whose data values nest
// deeper than job.MaxOutputJSONDepth: each such value of a JSON MIME type
// becomes its text, a JSON string, and its type is returned. Done on the
// line, before it is decoded: a value nested past any decoder's bound
// (Go's is 10,000 levels) would otherwise make the whole record unreadable.
func flattenDeep(line []byte) ([]byte, []string) {
	var out []byte
	var mimes []string
	last, depth := 0, 0
	var topKey, mime string // the latest string at depth 1 and in data
	inData := false
	for i := 0; i < len(line); i++ {
		switch c := line[i]; c {
		case '"':
			end := stringEnd(line, i)
			var str string
			_ = json.Unmarshal(line[i:end], &str)
			switch {
			case depth == 1:
				topKey = str
			case depth == 2 && inData:
				mime = str
			}
			i = end - 1
		case '{', '[':
			if depth == 1 && c == '{' && topKey == "data" {
				inData = true
			}
			if depth == 2 && inData && job.IsJSONMIME(mime) {
				end := valueEnd(line, i)
				if deeperThan(line[i:end], job.MaxOutputJSONDepth) {
					text, _ := json.Marshal(string(line[i:end]))
					out = append(append(out, line[last:i]...), text...)
					last = end
					mimes = append(mimes, mime)
				}
				i = end - 1
				continue
			}
			depth++
		case '}', ']':
			if depth--; depth <= 1 {
				inData = false
			}
		}
	}
	if mimes == nil {
		return line, nil
	}
	slices.Sort(mimes)
	return append(out, line[last:]...), mimes
}

// stringEnd is the index just past the JSON string literal that starts
// with the quote at b[i].
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// valueEnd is the index just past the array or object that starts at
// b[i].
func valueEnd(b []byte, i int) int {
	depth := 0
	for j := i; j < len(b); j++ {
		switch b[j] {
		case '"':
			j = stringEnd(b, j) - 1
		case '[', '{':
			depth++
		case ']', '}':
			if depth--; depth == 0 {
				return j + 1
			}
		}
	}
	return len(b)
}

// deeperThan reports whether the JSON text b nests arrays and objects
// deeper than max. It counts brackets outside strings, without decoding,
// so its cost does not depend on the depth.
func deeperThan(b []byte, max int) bool {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			i = stringEnd(b, i) - 1
		case '[', '{':
			if depth++; depth > max {
				return true
			}
		case ']', '}':
			depth--
		}
	}
	return false
}

// ReadOutputsFile reads a container's output channel file, at path on the
// host, once every process of its job is gone; "" is no file. It opens no
// link and nothing but a regular file. A file longer than the channel's
// bound is read up to it and flagged.
func ReadOutputsFile(path string) (OutputStream, error) {
	if path == "" {
		return OutputStream{}, nil
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return OutputStream{}, fmt.Errorf("open output channel file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return OutputStream{}, fmt.Errorf("output channel file is not a regular file: %w", err)
	}
	st := ReadOutputStream(io.LimitReader(f, job.MaxOutputsBytes), false)
	if fi.Size() > job.MaxOutputsBytes {
		st.truncated = true
		st.dropped++
	}
	return st, nil
}

// PlaceOutputs puts what the channel carried into res: the outputs, each
// value over the inline bounds stored as an artifact (named under
// job.OutputArtifactDir, never one of res.Artifacts' names), and the counts
// of what was not kept. With a nil store a long value is cut to the start
// of its text/plain form and the cut reported. The exception is attached by
// AttachException once the result is judged.
func PlaceOutputs(ctx context.Context, store Store, res *job.Result, st OutputStream) {
	res.OutputsDropped += st.dropped
	res.OutputsTruncated = res.OutputsTruncated || st.truncated || st.dropped > 0
	if len(st.outputs) == 0 {
		return
	}
	names := make(map[string]bool, len(res.Artifacts))
	for _, a := range res.Artifacts {
		names[a.Name] = true
	}
	inline := 0
	for i := range st.outputs {
		o := &st.outputs[i]
		mimes := make([]string, 0, len(o.Data))
		for m := range o.Data {
			mimes = append(mimes, m)
		}
		// text/plain first: it is the one value every output keeps.
		slices.SortFunc(mimes, func(a, b string) int {
			switch {
			case a == job.MIMEText:
				return -1
			case b == job.MIMEText:
				return 1
			}
			return strings.Compare(a, b)
		})
		for _, m := range mimes {
			raw := o.Data[m]
			if len(raw) <= job.MaxOutputValueInline && inline+len(raw) <= job.MaxOutputsInline {
				inline += len(raw)
				continue
			}
			name, err := storeOutputValue(ctx, store, res, names, i, o, m, raw)
			if err != nil {
				res.OutputsTruncated = true
			} else {
				if o.Artifacts == nil {
					o.Artifacts = map[string]string{}
				}
				o.Artifacts[m] = name
			}
			delete(o.Data, m)
			if m == job.MIMEText {
				// Every output keeps a text form: the start of it.
				short, _ := json.Marshal(prefix(raw, 4096))
				o.Data[m] = short
				inline += len(short)
			}
		}
		res.Outputs = append(res.Outputs, *o)
	}
}

// prefix is the first n bytes of the string value raw (whole characters).
func prefix(raw json.RawMessage, n int) string {
	var s string
	_ = json.Unmarshal(raw, &s)
	if len(s) <= n {
		return s
	}
	for n > 0 && (s[n]&0xC0) == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// storeOutputValue stores one value of output i as an artifact named under
// job.OutputArtifactDir and lists it in res.Artifacts.
func storeOutputValue(ctx context.Context, store Store, res *job.Result,
	names map[string]bool, i int, o *job.Output, mime string, raw json.RawMessage) (string, error) {
	if store == nil {
		return "", errors.New("no artifact store")
	}
	var b []byte
	switch {
	case job.IsJSONMIME(mime) && !slices.Contains(o.Flattened, mime):
		b = raw
	default:
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("output value: %w", err)
		}
		if job.IsBinaryMIME(mime) {
			d, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return "", fmt.Errorf("output value: %w", err)
			}
			b = d
		} else {
			b = []byte(s)
		}
	}
	sum := sha256.Sum256(b)
	ref := job.ObjectRef{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b))}
	if err := store(ctx, ref, bytes.NewReader(b)); err != nil {
		return "", fmt.Errorf("store output value: %w", err)
	}
	base := fmt.Sprintf("%s/%d%s", job.OutputArtifactDir, i+1, extensionOf(mime))
	name := base
	for n := 2; names[name]; n++ {
		name = fmt.Sprintf("%s.%d", base, n)
	}
	names[name] = true
	res.Artifacts = append(res.Artifacts, job.Artifact{Name: name, Size: ref.Size, SHA256: ref.SHA256, ContentType: mime})
	return name, nil
}

func extensionOf(mime string) string {
	switch mime {
	case job.MIMEPNG:
		return ".png"
	case job.MIMEJPEG:
		return ".jpg"
	case job.MIMESVG:
		return ".svg"
	case job.MIMEHTML:
		return ".html"
	case job.MIMEMarkdown:
		return ".md"
	case job.MIMEJSON:
		return ".json"
	case job.MIMEText:
		return ".txt"
	}
	return ".bin"
}

// ExceptionExitCode is the exit status both launchers give a program
// that ends with an uncaught exception or a syntax error (CPython's and
// node's own); Python's launcher gives a KeyboardInterrupt
// KeyboardInterruptExitCode.
const (
	ExceptionExitCode         = 1
	KeyboardInterruptExitCode = 130
)

// ProgramDir is where a program's own files are: an exception's frames
// outside it (the launcher's, the runtime's libraries) are not the
// program's and are dropped.
const ProgramDir = "/work/"

// AttachException gives a program's failure (a judged result of category
// runtime_error or syntax_error) the exception its launcher reported, when
// the run ended as the launcher ends an uncaught exception: exit status
// ExceptionExitCode, no signal, and one exception record on the channel.
// The channel's descriptor is in the program's own process, so a program
// can write a record itself; one whose ending does not bear it out (a
// record and then sys.exit(3), or two records) is not attached and counts
// in res.OutputsDropped as a channel record not kept. Frames outside
// ProgramDir are dropped. What is attached remains the program's own
// account of its failure: a program that forges a record and then exits
// as an uncaught exception does is believed.
func AttachException(res *job.Result, st OutputStream) {
	if st.exception == nil {
		return
	}
	if !exceptionEnding(res, st) {
		res.OutputsDropped += st.exceptions
		res.OutputsTruncated = true
		return
	}
	e := *st.exception
	e.Frames = nil
	for _, f := range st.exception.Frames {
		if strings.HasPrefix(f.File, ProgramDir) && !strings.Contains(f.File, "/../") && f.Line > 0 {
			e.Frames = append(e.Frames, f)
		}
	}
	res.Error.Exception = &e
}

// exceptionEnding reports whether res ended as a launcher ends a program
// with the one uncaught exception st carries.
func exceptionEnding(res *job.Result, st OutputStream) bool {
	if res.Error == nil || st.exceptions != 1 || res.Signal != "" || res.ExitCode == nil {
		return false
	}
	if res.Error.Category != job.CategoryRuntimeError && res.Error.Category != job.CategorySyntaxError {
		return false
	}
	switch *res.ExitCode {
	case ExceptionExitCode:
		return true
	case KeyboardInterruptExitCode:
		return st.exception.Type == "KeyboardInterrupt"
	}
	return false
}
