package resultio

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/kilnrun/kiln/job"
)

// Opener opens a stored object for reading.
type Opener func(ctx context.Context, ref job.ObjectRef) (io.ReadCloser, error)

// SpilledBytes is how many output bytes of r are kept in the object store.
func SpilledBytes(r *job.Result) int64 {
	var n int64
	for _, o := range []*job.OutputObject{r.StdoutObject, r.StderrObject} {
		if o != nil {
			n += o.Size
		}
	}
	return n
}

// Load reads r's spilled streams back into its text (and base64) fields
// and clears the objects, leaving r as if its output had been inline.
func Load(ctx context.Context, open Opener, r *job.Result) error {
	if !r.Spilled() {
		return nil
	}
	read := func(o *job.OutputObject, text, b64 string) ([]byte, error) {
		if o == nil {
			return job.RawOutput(text, b64)
		}
		rc, err := open(ctx, o.ObjectRef)
		if err != nil {
			return nil, fmt.Errorf("read output %s: %w", o.Name(), err)
		}
		defer rc.Close()
		b, err := io.ReadAll(io.LimitReader(rc, o.Size+1))
		if err != nil {
			return nil, fmt.Errorf("read output %s: %w", o.Name(), err)
		}
		if int64(len(b)) != o.Size {
			return nil, fmt.Errorf("read output %s: %d bytes, expected %d", o.Name(), len(b), o.Size)
		}
		return b, nil
	}
	stdout, err := read(r.StdoutObject, r.Stdout, r.StdoutBase64)
	if err != nil {
		return err
	}
	stderr, err := read(r.StderrObject, r.Stderr, r.StderrBase64)
	if err != nil {
		return err
	}
	r.SetOutput(stdout, stderr)
	r.StdoutObject, r.StderrObject = nil, nil
	return nil
}

// Write writes the JSON that encode produces for a value holding *r (encode
// is called once, with r's output fields set to placeholders), with each
// spilled stream of r read from the object store and escaped into the JSON
// as it is written: the same document encode would give had the output been
// inline. r is left as it was. An error after the first byte was written
// leaves the document cut short; the caller can only log it and close.
func Write(ctx context.Context, w io.Writer, r *job.Result, encode func() ([]byte, error), open Opener) error {
	if !r.Spilled() {
		b, err := encode()
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	saved := *r
	defer func() { *r = saved }()
	nonce := rand.Text()
	type part struct {
		token []byte // the placeholder as encode writes it, quotes included
		obj   *job.OutputObject
		b64   bool
	}
	var parts []part
	place := func(name string, o *job.OutputObject, text, b64 *string) {
		if o == nil {
			return
		}
		*text = "\x00" + nonce + ":" + name + "\x00"
		parts = append(parts, part{token: []byte(`"\u0000` + nonce + ":" + name + `\u0000"`), obj: o})
		if !o.UTF8 {
			*b64 = "\x00" + nonce + ":" + name + "_base64\x00"
			parts = append(parts, part{token: []byte(`"\u0000` + nonce + ":" + name + `_base64\u0000"`), obj: o, b64: true})
		}
	}
	place("stdout", r.StdoutObject, &r.Stdout, &r.StdoutBase64)
	place("stderr", r.StderrObject, &r.Stderr, &r.StderrBase64)
	doc, err := encode()
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	for len(doc) > 0 {
		at, which := -1, -1
		for i, p := range parts {
			if j := bytes.Index(doc, p.token); j >= 0 && (at < 0 || j < at) {
				at, which = j, i
			}
		}
		if at < 0 {
			break
		}
		if _, err := bw.Write(doc[:at]); err != nil {
			return err
		}
		p := parts[which]
		if err := writeStream(ctx, bw, open, p.obj, p.b64); err != nil {
			return err
		}
		doc = doc[at+len(p.token):]
	}
	if _, err := bw.Write(doc); err != nil {
		return err
	}
	return bw.Flush()
}

// writeStream writes one stored stream as a JSON string: its text, or with
// b64 its exact bytes in base64.
func writeStream(ctx context.Context, w *bufio.Writer, open Opener, o *job.OutputObject, b64 bool) error {
	rc, err := open(ctx, o.ObjectRef)
	if err != nil {
		return fmt.Errorf("open output %s: %w", o.Name(), err)
	}
	defer rc.Close()
	if err := w.WriteByte('"'); err != nil {
		return err
	}
	var n int64
	if b64 {
		enc := base64.NewEncoder(base64.StdEncoding, w)
		if n, err = io.Copy(enc, rc); err == nil {
			err = enc.Close()
		}
	} else {
		n, err = writeText(w, rc)
	}
	if err != nil {
		return fmt.Errorf("stream output %s: %w", o.Name(), err)
	}
	if n != o.Size {
		return fmt.Errorf("stream output %s: %d bytes, expected %d", o.Name(), n, o.Size)
	}
	return w.WriteByte('"')
}

const hexDigits = "0123456789abcdef"

// writeText writes r's bytes as the inside of a JSON string, each run of
// invalid UTF-8 replaced by one U+FFFD as job.Result.SetOutput does.
func writeText(w *bufio.Writer, r io.Reader) (int64, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var n int64
	bad := false
	for {
		c, size, err := br.ReadRune()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n += int64(size)
		if c == utf8.RuneError && size == 1 {
			if !bad {
				w.WriteRune(utf8.RuneError)
			}
			bad = true
			continue
		}
		bad = false
		switch {
		case c == '"':
			w.WriteString(`\"`)
		case c == '\\':
			w.WriteString(`\\`)
		case c == '\n':
			w.WriteString(`\n`)
		case c == '\r':
			w.WriteString(`\r`)
		case c == '\t':
			w.WriteString(`\t`)
		case c < 0x20:
			w.WriteString(`\u00`)
			w.WriteByte(hexDigits[c>>4])
			w.WriteByte(hexDigits[c&0xf])
		case c == '\u2028':
			w.WriteString(`\u2028`)
		case c == '\u2029':
			w.WriteString(`\u2029`)
		default:
			if _, err := w.WriteRune(c); err != nil {
				return n, err
			}
		}
	}
}
