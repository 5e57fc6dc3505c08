package job

import (
	"encoding/base64"
	"unicode/utf8"
)

// MaxInlineOutputBytes is the most bytes of one output stream (stdout or
// stderr) kept inline in a stored Result. A longer stream is kept in the
// object store (Result.StdoutObject/StderrObject), so no stored Result grows
// with a job's output and the result store's values stay small.
const MaxInlineOutputBytes = 64 << 10

// OutputObject locates one output stream kept in the object store rather
// than inline in the stored Result.
type OutputObject struct {
	ObjectRef
	// UTF8 reports whether the bytes are valid UTF-8: when false, an answer
	// carries the text with U+FFFD for invalid bytes plus the exact bytes in
	// base64, as for inline output (see Result).
	UTF8 bool `json:"utf8"`
}

// RawOutput returns the exact bytes of an inline stream: its base64 form
// when the program wrote invalid UTF-8, else the text.
func RawOutput(text, b64 string) ([]byte, error) {
	if b64 != "" {
		return base64.StdEncoding.DecodeString(b64)
	}
	return []byte(text), nil
}

// Spilled reports whether any output stream is kept in the object store.
func (r *Result) Spilled() bool { return r.StdoutObject != nil || r.StderrObject != nil }

// NewOutputObject describes b stored under ref.
func NewOutputObject(ref ObjectRef, b []byte) *OutputObject {
	return &OutputObject{ObjectRef: ref, UTF8: utf8.Valid(b)}
}
