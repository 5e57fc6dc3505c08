package tooluse

import (
	"encoding/base64"
	"fmt"
	"strings"

	"golang.org/x/net/html"

	"github.com/kilnrun/kiln/job"
)

// What a model is shown of a job's display outputs and exception, on every
// surface alike (Render is the one place): each output's text (markdown,
// else HTML reduced to text, else text/plain) in the result's text, each
// inline image as an image block, and the exception's fields.

// maxOutputText bounds the text of one output in a tool result.
const maxOutputText = 16 << 10

// writeOutputs adds res's outputs to b and their images to out; route is
// where the API serves the result ("" when unknown).
func writeOutputs(b *strings.Builder, res job.Result, route string, out *Reply) {
	if len(res.Outputs) == 0 && !res.OutputsTruncated {
		return
	}
	b.WriteString("outputs:\n")
	for i, o := range res.Outputs {
		kind := "display"
		if o.Type == job.OutputResult {
			kind = "result (last expression)"
		}
		fmt.Fprintf(b, "[%d] %s:\n", i+1, kind)
		text := OutputText(o)
		if len(text) > maxOutputText {
			text = text[:maxOutputText] + "\n… (cut)"
		}
		if text != "" {
			b.WriteString(text)
			if !strings.HasSuffix(text, "\n") {
				b.WriteByte('\n')
			}
		}
		for _, mt := range o.Flattened {
			fmt.Fprintf(b, "(%s nested deeper than %d levels: carried as its JSON text)\n", mt, job.MaxOutputJSONDepth)
		}
		for _, mt := range InlineImageTypes {
			v := o.Text(mt)
			if v == "" {
				if name := o.Artifacts[mt]; name != "" {
					// Too large to carry inline: an artifact (listed below,
					// and shown inline where the surface can).
					fmt.Fprintf(b, "(%s image stored as artifact %s)\n", mt, name)
				}
				continue
			}
			data, err := base64.StdEncoding.DecodeString(v)
			if err != nil || !Inline(mt, len(data)) {
				continue
			}
			img := Image{Name: fmt.Sprintf("output-%d", i+1), MediaType: mt, Data: data,
				Where: fmt.Sprintf("outputs[%d].data[%q] (base64) of the result", i, mt)}
			if route != "" {
				img.Where = fmt.Sprintf("outputs[%d].data[%q] (base64) of GET %s", i, mt, route)
			}
			out.Images = append(out.Images, img)
			fmt.Fprintf(b, "(image %s, %s)\n", img.Name, mt)
		}
	}
	if res.OutputsTruncated {
		fmt.Fprintf(b, "outputs_truncated: %d outputs not kept\n", res.OutputsDropped)
	}
}

// OutputText is the text a model reads of one output: its markdown, else
// its HTML reduced to text (a DataFrame's table), else its text/plain.
// The text/plain of an object with an HTML form is often only its repr
// ("<IPython.core.display.HTML object>"), so HTML wins when both exist and
// the plain text looks like a bare repr.
func OutputText(o job.Output) string {
	if md := o.Text(job.MIMEMarkdown); md != "" {
		return md
	}
	plain := o.Text(job.MIMEText)
	if h := o.Text(job.MIMEHTML); h != "" && (plain == "" || strings.HasPrefix(plain, "<") && strings.HasSuffix(plain, ">")) {
		return HTMLText(h)
	}
	return plain
}

// HTMLText reduces HTML to text for a model: table rows as "a | b" lines,
// block elements on their own lines, scripts and styles left out.
func HTMLText(s string) string {
	z := html.NewTokenizer(strings.NewReader(s))
	var b strings.Builder
	skip := 0
	cell := false
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken:
			return strings.TrimSpace(collapseBlankLines(b.String()))
		case html.TextToken:
			if skip > 0 {
				continue
			}
			t := strings.Join(strings.Fields(string(z.Text())), " ")
			if t == "" {
				continue
			}
			if cell {
				b.WriteString(" | ")
			}
			b.WriteString(t)
		case html.StartTagToken, html.EndTagToken, html.SelfClosingTagToken:
			name, _ := z.TagName()
			switch string(name) {
			case "script", "style":
				if tt == html.StartTagToken {
					skip++
				} else if tt == html.EndTagToken && skip > 0 {
					skip--
				}
			case "tr", "br", "p", "div", "li", "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "pre":
				b.WriteByte('\n')
				cell = false
			case "td", "th":
				if tt == html.StartTagToken {
					cell = b.Len() > 0 && !strings.HasSuffix(b.String(), "\n")
				}
			}
		}
	}
}

func collapseBlankLines(s string) string {
	lines := strings.Split(s, "\n")
	out := lines[:0]
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		out = append(out, strings.TrimSpace(l))
	}
	return strings.Join(out, "\n")
}

// writeException adds the failure's structured exception to b.
func writeException(b *strings.Builder, e *job.Exception) {
	if e == nil {
		return
	}
	fmt.Fprintf(b, "exception_type: %s\n", e.Type)
	fmt.Fprintf(b, "exception_message: %s\n", e.Message)
	if e.Line > 0 {
		fmt.Fprintf(b, "exception_line: %d\n", e.Line)
	}
	if e.Column > 0 {
		fmt.Fprintf(b, "exception_column: %d\n", e.Column)
	}
	if e.SourceLine != "" {
		fmt.Fprintf(b, "exception_source_line: %s\n", e.SourceLine)
	}
	if len(e.Frames) > 0 {
		b.WriteString("exception_frames:\n")
		for _, f := range e.Frames {
			fmt.Fprintf(b, "- %s:%d in %s\n", f.File, f.Line, f.Function)
		}
	}
}
