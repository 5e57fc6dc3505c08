package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer/client"
)

// Display outputs on the command line: what a notebook would show. An
// output's text/plain is printed (unless the output is an image, whose
// text is only a placeholder such as "<Figure size 640x480 with 1 Axes>");
// every other type (images, HTML, JSON, ...) is saved under --out as
// output-N.<ext>, N its place among the job's outputs, with a line on
// stderr naming each; without --out the line says how to save it.

// outputExt is the file extension output-N takes for a MIME type.
func outputExt(mimeType string) string {
	switch mimeType {
	case job.MIMEPNG:
		return "png"
	case job.MIMEJPEG:
		return "jpg"
	case job.MIMESVG:
		return "svg"
	case job.MIMEHTML:
		return "html"
	case job.MIMEMarkdown:
		return "md"
	case job.MIMEJSON:
		return "json"
	case "text/latex":
		return "tex"
	case "application/pdf":
		return "pdf"
	}
	if exts, _ := mime.ExtensionsByType(mimeType); len(exts) > 0 {
		return strings.TrimPrefix(exts[0], ".")
	}
	return "bin"
}

// isImageOutput reports whether an output is an image (a figure).
func isImageOutput(o job.Output) bool {
	for _, m := range outputTypes(o) {
		if strings.HasPrefix(m, "image/") {
			return true
		}
	}
	return false
}

// outputTypes are the output's MIME types, inline or stored, sorted.
func outputTypes(o job.Output) []string {
	var out []string
	for m := range o.Data {
		out = append(out, m)
	}
	for m := range o.Artifacts {
		if _, dup := o.Data[m]; !dup {
			out = append(out, m)
		}
	}
	sort.Strings(out)
	return out
}

// showOutputs prints the outputs' text to w and saves the other types
// under dir ("" lists them on stderr instead). who prefixes the lines
// ("kiln run").
func showOutputs(ctx context.Context, c *client.Client, w io.Writer, id string, outs []job.Output, dir, who string) error {
	for i, o := range outs {
		n := i + 1
		if !isImageOutput(o) {
			if text := o.Text(job.MIMEText); text != "" {
				_, _ = io.WriteString(w, text)
				if !strings.HasSuffix(text, "\n") {
					_, _ = io.WriteString(w, "\n")
				}
			}
		}
		for _, m := range outputTypes(o) {
			if m == job.MIMEText {
				continue
			}
			name := fmt.Sprintf("output-%d.%s", n, outputExt(m))
			if dir == "" {
				fmt.Fprintf(os.Stderr, "%s: output %d has %s; save it with --out DIR (as %s)\n", who, n, m, name)
				continue
			}
			b, err := outputValue(ctx, c, id, o, m)
			if err != nil {
				return fmt.Errorf("output %d (%s): %w", n, m, err)
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			dst := filepath.Join(dir, name)
			if err := os.WriteFile(dst, b, 0o644); err != nil {
				return fmt.Errorf("output %d (%s): %w", n, m, err)
			}
			note := ""
			if slices.Contains(o.Flattened, m) {
				note = fmt.Sprintf(", nested deeper than %d levels: its JSON text", job.MaxOutputJSONDepth)
			}
			fmt.Fprintf(os.Stderr, "%s: saved output %d (%s, %d bytes%s) to %s\n", who, n, m, len(b), note, dst)
		}
	}
	return nil
}

// outputValue is the bytes of an output's MIME type m: decoded from the
// result, or downloaded from the artifact that holds a value too long to
// carry inline (c nil: not downloadable).
func outputValue(ctx context.Context, c *client.Client, id string, o job.Output, m string) ([]byte, error) {
	if raw, ok := o.Data[m]; ok {
		if job.IsJSONMIME(m) && !slices.Contains(o.Flattened, m) {
			return append([]byte(raw), '\n'), nil
		}
		// A text type, or a JSON value nested too deep to carry as one
		// (Output.Flattened): a string, saved as its text.
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("not a string: %w", err)
		}
		if job.IsBinaryMIME(m) {
			return base64.StdEncoding.DecodeString(s)
		}
		return []byte(s), nil
	}
	name := o.Artifacts[m]
	if name == "" || c == nil {
		return nil, fmt.Errorf("not in the result")
	}
	body, err := c.Artifact(ctx, id, name)
	if err != nil {
		return nil, fmt.Errorf("download artifact %s: %w", name, err)
	}
	defer body.Close()
	b, err := io.ReadAll(body) // stored decoded: the bytes themselves
	if err != nil {
		return nil, fmt.Errorf("download artifact %s: %w", name, err)
	}
	return b, nil
}
