package tooluse

import (
	"encoding/base64"
	"fmt"
	"mime"
	"net/url"
	"path"
	"strings"

	"github.com/kilnrun/kiln/job"
)

// Reply is a tool result, vendor-neutral: what the model reads.
type Reply struct {
	// IsError marks a failed run (or a call that could not run).
	IsError bool
	// Text is the result for the model: status, exit code, wall time,
	// stdout, stderr, and on failure the category and what to do next.
	Text string
	// Artifacts are the files the job left, with the route to fetch each.
	Artifacts []ArtifactRef
	// Images are the display outputs' images, then the artifacts small
	// enough, and of a type, to show the model inline.
	Images []Image
}

// ArtifactRef names one artifact of a job.
type ArtifactRef struct {
	Name      string
	MediaType string
	// Path is the API route of the artifact, /v1/jobs/{id}/artifacts/{name}.
	Path string
}

// Image is an inline image (base64 in the vendor's block).
type Image struct {
	Name      string
	MediaType string
	Data      []byte
	// Where says where the API serves the image, for a format that cannot
	// carry it: an output's place in the run's result (`outputs[1].data
	// ["image/png"] of GET /v1/jobs/{id}`), or an artifact's route ("GET
	// /v1/jobs/{id}/artifacts/{name}").
	Where string
}

// InlineImageTypes are the artifact media types shown to the model inline.
var InlineImageTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// MaxInlineImageBytes bounds one inline image (the vendors refuse larger ones).
const MaxInlineImageBytes = 5 << 20

// Advice is what a model can do about a failure category.
type Advice struct {
	// ChangeCode says whether calling again with changed code can help: "yes", "maybe" or "no".
	ChangeCode string
	// RetrySame says whether the very same call may succeed if made again.
	RetrySame bool
	// Hint says what to do, in one sentence.
	Hint string
}

// AdviceFor returns the advice for a failure category. maxTimeoutS, when
// known, is quoted for timeouts.
func AdviceFor(c job.Category, maxTimeoutS string) Advice {
	switch c {
	case job.CategorySyntaxError:
		return Advice{"yes", false, "the program does not parse: fix the syntax error shown in stderr and call again"}
	case job.CategoryRuntimeError:
		return Advice{"yes", false, "the program failed while running: read stderr, fix the code and call again"}
	case job.CategoryTimeout:
		h := "the program ran past its time limit: do less work (smaller input, faster algorithm) or raise timeout_s"
		if maxTimeoutS != "" {
			h += " (at most " + maxTimeoutS + " s)"
		}
		return Advice{"maybe", false, h}
	case job.CategoryMemoryLimit:
		return Advice{"maybe", false, "the program used more memory than allowed: process the data in smaller pieces"}
	case job.CategoryOutputLimit:
		return Advice{"maybe", false, "the program's output (what it printed, or files it left) is more than a limit allows (the error names it): print or save less (a summary, not every row)"}
	case job.CategoryForbidden:
		return Advice{"maybe", false, "the sandbox forbids what the program tried (it has no network and no privileges): change the approach"}
	case job.CategoryInvalidRequest:
		return Advice{"yes", false, "the tool input was not valid: fix the input as the message says and call again"}
	case job.CategoryCanceled:
		return Advice{"no", false, "the run was canceled by its owner"}
	case job.CategoryInternal:
		return Advice{"no", true, "the platform failed, not the program: make the same call again"}
	case job.CategoryQuota:
		return Advice{"no", false, "the caller's quota (named in the error) does not allow this run now: ask for less (a lower limit), or stop until it renews"}
	}
	return Advice{"maybe", false, "see the error message"}
}

// Render turns a terminal result into the tool result the model reads.
// maxTimeoutS is quoted in timeout advice ("" to leave it out).
func Render(res job.Result, maxTimeoutS string) Reply {
	route := ""
	if res.ID != "" {
		route = "/v1/jobs/" + url.PathEscape(res.ID)
	}
	return render(res, maxTimeoutS, route)
}

// render is Render for a result the API serves at route (GET), "" when
// unknown.
func render(res job.Result, maxTimeoutS, route string) Reply {
	var b strings.Builder
	fmt.Fprintf(&b, "status: %s\n", res.Status)
	if res.ExitCode != nil {
		fmt.Fprintf(&b, "exit_code: %d\n", *res.ExitCode)
	}
	if res.Signal != "" {
		fmt.Fprintf(&b, "signal: %s\n", res.Signal)
	}
	fmt.Fprintf(&b, "wall_time_ms: %d\n", res.WallMS)
	isError := res.Status != job.StatusSucceeded
	if res.Error != nil {
		a := AdviceFor(res.Error.Category, maxTimeoutS)
		fmt.Fprintf(&b, "error_category: %s\n", res.Error.Category)
		if res.Error.Message != "" {
			fmt.Fprintf(&b, "error: %s\n", res.Error.Message)
		}
		fmt.Fprintf(&b, "retry_with_changed_code_can_help: %s\n", a.ChangeCode)
		fmt.Fprintf(&b, "retry_same_call_can_help: %t\n", a.RetrySame)
		fmt.Fprintf(&b, "what_to_do: %s\n", a.Hint)
		writeException(&b, res.Error.Exception)
	} else if isError {
		fmt.Fprintf(&b, "error_category: %s\n", categoryOf(res.Status))
	}
	writeStream(&b, "stdout", res.Stdout, res.StdoutTruncated, res.StdoutBytes)
	writeStream(&b, "stderr", res.Stderr, res.StderrTruncated, res.StderrBytes)
	out := Reply{IsError: isError}
	writeOutputs(&b, res, route, &out)
	for _, a := range res.Artifacts {
		// The server sniffs the type from the content; the name is only a
		// fallback (an HTML file named page.png is not an image).
		mt := MediaType(a.Name)
		if a.ContentType != "" {
			mt, _, _ = strings.Cut(a.ContentType, ";")
		}
		ref := ArtifactRef{Name: a.Name, MediaType: mt, Path: ArtifactPath(res.ID, a.Name)}
		out.Artifacts = append(out.Artifacts, ref)
	}
	if len(out.Artifacts) > 0 {
		b.WriteString("artifacts:\n")
		for _, a := range out.Artifacts {
			fmt.Fprintf(&b, "- %s (%s): %s\n", a.Name, a.MediaType, a.Path)
		}
	}
	if res.ID != "" {
		fmt.Fprintf(&b, "job_id: %s\n", res.ID)
	}
	out.Text = b.String()
	return out
}

// categoryOf names the failure of a status that came without an error part.
func categoryOf(s job.Status) job.Category {
	switch s {
	case job.StatusTimedOut:
		return job.CategoryTimeout
	case job.StatusOOMKilled:
		return job.CategoryMemoryLimit
	case job.StatusCanceled:
		return job.CategoryCanceled
	case job.StatusFailed:
		return job.CategoryRuntimeError
	}
	return job.CategoryInternal
}

func writeStream(b *strings.Builder, name, text string, truncated bool, total int64) {
	if truncated {
		fmt.Fprintf(b, "%s (truncated: the first part of %d bytes):\n", name, total)
	} else {
		fmt.Fprintf(b, "%s:\n", name)
	}
	b.WriteString(text)
	if text != "" && !strings.HasSuffix(text, "\n") {
		b.WriteByte('\n')
	}
}

// Failed is the reply to a call that did not produce a run: bad input
// (category invalid_request) or a job that did not finish in time.
func Failed(c job.Category, msg string) Reply {
	a := AdviceFor(c, "")
	return Reply{IsError: true, Text: fmt.Sprintf("status: not run\nerror_category: %s\nerror: %s\n"+
		"retry_with_changed_code_can_help: %s\nretry_same_call_can_help: %t\nwhat_to_do: %s\n",
		c, msg, a.ChangeCode, a.RetrySame, a.Hint)}
}

// Unfinished is the reply for a job still queued or running when the
// caller stopped waiting: the run goes on; job_id lets an agent fetch it later.
func Unfinished(id string, st job.Status, waited string) Reply {
	return Reply{IsError: true, Text: fmt.Sprintf("status: %s\nerror_category: internal\n"+
		"error: the job did not finish within %s of waiting (the queue is busy); it keeps running\n"+
		"retry_with_changed_code_can_help: no\nretry_same_call_can_help: true\n"+
		"what_to_do: wait and make the same call again, or fetch GET /v1/jobs/%s\njob_id: %s\n", st, waited, id, id)}
}

// ArtifactPath is the API route of a job's artifact.
func ArtifactPath(jobID, name string) string {
	return "/v1/jobs/" + url.PathEscape(jobID) + "/artifacts/" + url.PathEscape(name)
}

// commonTypes are media types that mime.TypeByExtension only knows when
// the host has a mime.types file.
var commonTypes = map[string]string{".csv": "text/csv", ".txt": "text/plain", ".md": "text/markdown", ".tsv": "text/tab-separated-values"}

// MediaType guesses an artifact's media type from its name.
func MediaType(name string) string {
	ext := strings.ToLower(path.Ext(name))
	if t, ok := commonTypes[ext]; ok {
		return t
	}
	if t := mime.TypeByExtension(ext); t != "" {
		t, _, _ = strings.Cut(t, ";")
		return t
	}
	return "application/octet-stream"
}

// Inline reports whether an artifact of this media type and size is shown
// to the model as an image.
func Inline(mediaType string, size int) bool {
	if size <= 0 || size > MaxInlineImageBytes {
		return false
	}
	for _, t := range InlineImageTypes {
		if t == mediaType {
			return true
		}
	}
	return false
}

// Block returns the tool result in the call's format:
//   - Anthropic: a tool_result content block, the text then each image as
//     a base64 image block;
//   - OpenAI Responses: a function_call_output item whose output is an
//     input_text part then each image as an input_image part (a data URL);
//   - OpenAI Chat Completions: a role "tool" message. Its content is text
//     only (that API takes no images in a tool message), so the images are
//     named at the end of the text with where the API serves them.
func (c Call) Block(o Reply) map[string]any {
	switch c.Format {
	case OpenAI:
		return map[string]any{"role": "tool", "tool_call_id": c.ID, "content": o.Text + imagesNotShown(o)}
	case OpenAIResponses:
		output := []map[string]any{{"type": "input_text", "text": o.Text}}
		for _, img := range o.Images {
			output = append(output, map[string]any{
				"type":      "input_image",
				"image_url": "data:" + img.MediaType + ";base64," + base64.StdEncoding.EncodeToString(img.Data),
			})
		}
		return map[string]any{"type": "function_call_output", "call_id": c.ID, "output": output}
	}
	content := []map[string]any{{"type": "text", "text": o.Text}}
	for _, img := range o.Images {
		content = append(content, map[string]any{
			"type": "image",
			"source": map[string]any{
				"type":       "base64",
				"media_type": img.MediaType,
				"data":       base64.StdEncoding.EncodeToString(img.Data),
			},
		})
	}
	return map[string]any{"type": "tool_result", "tool_use_id": c.ID, "content": content, "is_error": o.IsError}
}

// imagesNotShown names, for a text-only format, the images the other
// formats carry and where the API serves each: the outputs' images and
// the image artifacts ("" when there are none).
func imagesNotShown(o Reply) string {
	var lines []string
	listed := map[string]bool{}
	for _, img := range o.Images {
		lines = append(lines, fmt.Sprintf("- %s (%s): %s\n", img.Name, img.MediaType, img.Where))
		listed[img.Where] = true
	}
	for _, a := range o.Artifacts {
		if Inline(a.MediaType, 1) && !listed["GET "+a.Path] {
			lines = append(lines, fmt.Sprintf("- %s (%s): GET %s\n", a.Name, a.MediaType, a.Path))
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return "images_not_shown: a Chat Completions tool message carries text only; the API serves these images:\n" +
		strings.Join(lines, "")
}
