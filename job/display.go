package job

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Display outputs: what a program shows rather than prints. The Python
// launcher turns the value of the program's last expression (IPython's
// displayhook rule), every display(obj) call and every matplotlib figure
// (shown with plt.show() or still open at the end) into one Output each,
// shaped as Jupyter's MIME bundles. They reach the worker on a channel of
// their own (a descriptor only the launcher is handed), never through
// stdout, so printing cannot make one.

// Output types, as Jupyter names them.
const (
	// OutputResult is the value of the program's last expression.
	OutputResult = "execute_result"
	// OutputDisplay is a display() call or a figure.
	OutputDisplay = "display_data"
)

// Common MIME types of an output's data.
const (
	MIMEText     = "text/plain"
	MIMEHTML     = "text/html"
	MIMEMarkdown = "text/markdown"
	MIMEJSON     = "application/json"
	MIMEPNG      = "image/png"
	MIMEJPEG     = "image/jpeg"
	MIMESVG      = "image/svg+xml"
)

// Bounds on a job's display outputs. Whatever goes past them is counted in
// Result.OutputsDropped and flagged in Result.OutputsTruncated, never lost
// silently.
const (
	// MaxOutputs is how many outputs one job returns at most.
	MaxOutputs = 64
	// MaxOutputValueInline is the longest value (as carried: base64 for
	// images) kept inline in the result; a longer one is stored as an
	// artifact and named in Output.Artifacts.
	MaxOutputValueInline = 128 << 10
	// MaxOutputsInline bounds the inline values of all outputs together;
	// past it, values are stored as artifacts as if they were too long.
	// With two inline streams (MaxInlineOutputBytes each) it keeps a
	// stored Result within the result store's bound on one value.
	MaxOutputsInline = 256 << 10
	// MaxOutputsBytes bounds what is read of the channel per job (the
	// rest is drained and counted as dropped).
	MaxOutputsBytes = 32 << 20
)

// MaxOutputJSONDepth is the deepest nesting of arrays and objects an
// application/json (or +json) value of an output keeps. A deeper value is
// carried as its JSON text, a string, and its MIME type listed in
// Output.Flattened: a JSON decoder that recurses once per level (Python's
// json at about 1,000 levels, Go's encoding/json at 10,000) could not
// read a result holding it.
const MaxOutputJSONDepth = 100

// OutputArtifactDir is the folder in a job's artifact names under which
// output values too long to carry inline are stored.
const OutputArtifactDir = ".outputs"

// Output is one display output: a MIME bundle. Data maps a MIME type to its
// value: a string for text types, base64 for binary ones (image/png), any
// JSON value for application/json. text/plain is always present.
type Output struct {
	Type string                     `json:"type"`
	Data map[string]json.RawMessage `json:"data"`
	// Artifacts maps a MIME type whose value was too long to carry inline
	// to the artifact that holds it (GET /v1/jobs/{id}/artifacts/{name});
	// the type is then absent from Data.
	Artifacts map[string]string `json:"artifacts,omitempty"`
	// Flattened lists the JSON MIME types whose value nested deeper than
	// MaxOutputJSONDepth: their value in Data (or artifact) is the JSON
	// text as a string, not the structure.
	Flattened []string `json:"flattened,omitempty"`
}

// Text returns the string value of MIME type mime, or "" when the output
// has none.
func (o Output) Text(mime string) string {
	raw, ok := o.Data[mime]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// Has reports whether the output carries mime inline.
func (o Output) Has(mime string) bool {
	_, ok := o.Data[mime]
	return ok
}

// Validate checks an output read from a launcher: a known type, a
// text/plain string, and every value a JSON string but application/json's
// (and the +json types).
func (o Output) Validate() error {
	if o.Type != OutputResult && o.Type != OutputDisplay {
		return fmt.Errorf("output type %q is not %s or %s", o.Type, OutputResult, OutputDisplay)
	}
	if _, ok := o.Data[MIMEText]; !ok {
		return fmt.Errorf("output has no %s", MIMEText)
	}
	for mime, raw := range o.Data {
		if mime == "" || len(mime) > 128 || !strings.Contains(mime, "/") {
			return fmt.Errorf("output MIME type %q is not valid", mime)
		}
		if IsJSONMIME(mime) {
			if !json.Valid(raw) {
				return fmt.Errorf("output %s is not JSON", mime)
			}
			continue
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("output %s is not a string: %w", mime, err)
		}
	}
	return nil
}

// IsJSONMIME reports whether values of mime are JSON values (application/json
// and the +json types) rather than strings.
func IsJSONMIME(mime string) bool { return mime == MIMEJSON || strings.HasSuffix(mime, "+json") }

// IsBinaryMIME reports whether values of mime are carried base64-encoded.
func IsBinaryMIME(mime string) bool {
	return strings.HasPrefix(mime, "image/") && mime != MIMESVG || mime == "application/pdf"
}

// Exception is the program's uncaught exception (or syntax error), as its
// launcher saw it: beside Failure's category and message, for agents that
// act on the type and the line rather than on text.
type Exception struct {
	// Type is the exception's class name ("ZeroDivisionError", "TypeError").
	Type string `json:"type"`
	// Message is the exception's message, without the type.
	Message string `json:"message"`
	// Line is the line of the program the exception was raised at (the
	// innermost frame of the program's own code), 1-based; 0 when unknown.
	Line int `json:"line,omitempty"`
	// Column is the 1-based column of a syntax error; 0 otherwise.
	Column int `json:"column,omitempty"`
	// SourceLine is the text of that line, trimmed.
	SourceLine string `json:"source_line,omitempty"`
	// Frames are the stack frames of the program's own files, outermost
	// first (frames of the runtime's libraries and of the launcher are left
	// out).
	Frames []Frame `json:"frames,omitempty"`
}

// Frame is one frame of an exception's stack.
type Frame struct {
	File     string `json:"file"`
	Line     int    `json:"line"`
	Function string `json:"function"`
}

// Bounds on an exception's fields (a program chooses its messages).
const (
	MaxExceptionMessage = 4096
	MaxExceptionFrames  = 32
)

// Bound cuts the exception's fields to their bounds.
func (e *Exception) Bound() {
	e.Type = cut(e.Type, 256)
	e.Message = cut(e.Message, MaxExceptionMessage)
	e.SourceLine = cut(e.SourceLine, 1024)
	if len(e.Frames) > MaxExceptionFrames {
		// The innermost frames say where it happened: keep those.
		e.Frames = e.Frames[len(e.Frames)-MaxExceptionFrames:]
	}
	for i := range e.Frames {
		e.Frames[i].File = cut(e.Frames[i].File, 512)
		e.Frames[i].Function = cut(e.Frames[i].Function, 256)
	}
}

// cut shortens s to at most n bytes, never within a character.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
