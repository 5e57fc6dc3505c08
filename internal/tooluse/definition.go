package tooluse

import (
	"fmt"
	"strings"

	"github.com/kilnrun/kiln/job"
)

// Format is a model vendor's tool schema.
type Format string

const (
	// Anthropic is the Messages API: tools {name, description, input_schema},
	// tool_use and tool_result content blocks.
	Anthropic Format = "anthropic"
	// OpenAI is the Chat Completions API: tools {type: "function", function:
	// {name, description, parameters}}, tool_calls and role "tool" messages
	// (text only: that API takes no images in a tool message).
	OpenAI Format = "openai"
	// OpenAIResponses is OpenAI's Responses API: flat function tools {type:
	// "function", name, description, parameters, strict}, function_call
	// items, and function_call_output items whose output carries text and
	// images.
	OpenAIResponses Format = "openai-responses"
)

// Formats lists every supported format, for error messages and docs.
var Formats = []Format{Anthropic, OpenAI, OpenAIResponses}

// ParseFormat returns the format called s, or an error naming the allowed values.
func ParseFormat(s string) (Format, error) {
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	if s == "" {
		return "", fmt.Errorf("format is missing: use %s", formatList())
	}
	return "", fmt.Errorf("format %q is not supported: use %s", s, formatList())
}

// formatList is "format=anthropic, format=openai or format=openai-responses".
func formatList() string {
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = "format=" + string(f)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// Definition is one run tool, vendor-neutral.
type Definition struct {
	// Name is the tool's name: "run_" + the runtime name with '-' as '_'.
	Name string
	// Runtime is the Kiln runtime the tool runs code in.
	Runtime string
	// Title is a short display name ("Run Python 3").
	Title string
	// Description tells the model what the tool does and its limits.
	Description string
	// InputSchema is the JSON Schema (draft 2020-12 subset both vendors
	// accept) of the tool's input object.
	InputSchema map[string]any
}

// ToolName is the tool name for runtime: "python" → "run_python",
// "python-slim" → "run_python_slim".
func ToolName(runtime string) string {
	return "run_" + strings.ReplaceAll(runtime, "-", "_")
}

// Definitions returns one run tool per runtime, in the order given.
func Definitions(runtimes []job.RuntimeInfo) []Definition {
	defs := make([]Definition, 0, len(runtimes))
	for _, rt := range runtimes {
		defs = append(defs, Define(rt))
	}
	return defs
}

// Define returns the run tool of one runtime.
func Define(rt job.RuntimeInfo) Definition {
	lang := languageName(rt.Name)
	defTimeout := seconds(rt.Limits.Default.TimeoutMS)
	maxTimeout := seconds(rt.Limits.Max.TimeoutMS)
	desc := fmt.Sprintf("Run a %s program in a fresh, isolated sandbox and return its standard output, "+
		"standard error, exit code and wall time. The sandbox has no network access and nothing persists "+
		"between calls: pass data in as stdin or files, and print the results you need. "+
		"%s%s"+
		"Files the program writes to $KILN_OUTPUT_DIR (/work/out) come back as artifacts (images shown inline). "+
		"Limits: %s s of wall time by default (timeout_s, at most %s s), %d MiB of memory. "+
		"On failure the result says the error category (syntax_error, runtime_error, timeout, ...), "+
		"the exception's type and line, and whether changing the code can help.",
		versioned(lang, rt.Version), displayNote(rt), packagesNote(rt), defTimeout, maxTimeout, rt.Limits.Default.MemoryMB)
	timeout := map[string]any{
		"type":             "number",
		"exclusiveMinimum": 0,
		"description":      fmt.Sprintf("Wall-clock limit in seconds (default %s, at most %s).", defTimeout, maxTimeout),
	}
	if rt.Limits.Max.TimeoutMS > 0 {
		timeout["maximum"] = float64(rt.Limits.Max.TimeoutMS) / 1000
	}
	return Definition{
		Name:        ToolName(rt.Name),
		Runtime:     rt.Name,
		Title:       title(rt, lang),
		Description: desc,
		InputSchema: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"code": map[string]any{
					"type":        "string",
					"description": fmt.Sprintf("The complete %s program to run.", lang),
				},
				"stdin": map[string]any{
					"type":        "string",
					"description": "Text fed to the program's standard input.",
				},
				"files": map[string]any{
					"type":        "array",
					"description": "Input files placed in the program's working directory before it starts.",
					"maxItems":    job.MaxFiles,
					"items": map[string]any{
						"type": "object",
						"properties": map[string]any{
							"name": map[string]any{
								"type":        "string",
								"description": "Relative path, e.g. data/input.csv.",
							},
							"content": map[string]any{
								"type":        "string",
								"description": "The file's content: text, or base64 when encoding is base64.",
							},
							"encoding": map[string]any{
								"type":        "string",
								"enum":        []string{"utf-8", "base64"},
								"description": "How content is encoded (default utf-8).",
							},
						},
						"required":             []string{"name", "content"},
						"additionalProperties": false,
					},
				},
				"timeout_s": timeout,
			},
			"required":             []string{"code"},
			"additionalProperties": false,
		},
	}
}

// Render returns the definition in format f's tool schema.
func (d Definition) Render(f Format) map[string]any {
	switch f {
	case OpenAI:
		return map[string]any{
			"type": "function",
			"function": map[string]any{
				"name":        d.Name,
				"description": d.Description,
				"parameters":  d.InputSchema,
			},
		}
	case OpenAIResponses:
		// strict defaults to true in the Responses API, and strict mode
		// wants every property required: stdin, files and timeout_s are
		// optional here.
		return map[string]any{
			"type":        "function",
			"name":        d.Name,
			"description": d.Description,
			"parameters":  d.InputSchema,
			"strict":      false,
		}
	}
	return map[string]any{"name": d.Name, "description": d.Description, "input_schema": d.InputSchema}
}

// Lookup returns the definition called name, or an error listing the tools.
func Lookup(defs []Definition, name string) (Definition, error) {
	names := make([]string, 0, len(defs))
	for _, d := range defs {
		if d.Name == name {
			return d, nil
		}
		names = append(names, d.Name)
	}
	if len(names) == 0 {
		return Definition{}, fmt.Errorf("unknown tool %q: no runtime is registered right now (no worker is running)", name)
	}
	return Definition{}, fmt.Errorf("unknown tool %q; the tools are: %s", name, strings.Join(names, ", "))
}

// languageName is how a description names a runtime's language.
func languageName(runtime string) string {
	base, _, _ := strings.Cut(runtime, "-")
	switch base {
	case "python":
		return "Python 3"
	case "node":
		return "JavaScript (Node.js)"
	}
	return runtime
}

// seconds renders milliseconds as seconds without a needless fraction.
func seconds(ms int64) string {
	if ms%1000 == 0 {
		return fmt.Sprint(ms / 1000)
	}
	return fmt.Sprintf("%.3g", float64(ms)/1000)
}

// versioned is the language with its version when the runtime reports one.
func versioned(lang, version string) string {
	if version == "" {
		return lang
	}
	return lang + " (" + version + ")"
}

// displayNote says what comes back besides what is printed: Python's
// launcher returns display outputs.
func displayNote(rt job.RuntimeInfo) string {
	if rt.Language != "python" && !strings.HasPrefix(rt.Name, "python") {
		return ""
	}
	note := "The value of the last expression (as in a notebook) and every display(obj) are returned too " +
		"(a DataFrame as a table)"
	if rt.Provides("matplotlib") {
		note += "; matplotlib figures are returned as images without savefig (plt.show() or left open)"
	}
	return note + ". "
}

// maxPackagesNamed bounds the packages a description names.
const maxPackagesNamed = 40

// packagesNote names what a program can import besides the standard
// library, so a model can tell the runtimes apart.
func packagesNote(rt job.RuntimeInfo) string {
	if len(rt.Packages) == 0 {
		if rt.Language == "" {
			return ""
		}
		return "Only the standard library is installed. "
	}
	names := make([]string, 0, len(rt.Packages))
	for _, p := range rt.Packages {
		n := p.Name
		if len(p.Modules) == 1 && p.Modules[0] != p.Name {
			n += " (import " + p.Modules[0] + ")"
		}
		names = append(names, n)
	}
	more := ""
	if len(names) > maxPackagesNamed {
		more = fmt.Sprintf(" and %d more (GET /v1/runtimes)", len(names)-maxPackagesNamed)
		names = names[:maxPackagesNamed]
	}
	return "Installed packages (nothing else can be installed): " + strings.Join(names, ", ") + more + ". "
}

// title tells runtimes of one language apart: "Run Python 3 (with numpy,
// pandas, matplotlib)" beside "Run Python 3 (slim: numpy)".
func title(rt job.RuntimeInfo, lang string) string {
	var key []string
	for _, m := range []string{"numpy", "pandas", "matplotlib", "scipy", "sklearn"} {
		if rt.Provides(m) {
			key = append(key, m)
		}
	}
	t := "Run " + lang
	switch {
	case strings.HasSuffix(rt.Name, "-slim") && len(key) > 0:
		t += " (slim: " + strings.Join(key, ", ") + ")"
	case strings.HasSuffix(rt.Name, "-slim"):
		t += " (slim)"
	case len(key) > 0:
		t += " (with " + strings.Join(key, ", ") + ")"
	}
	return t
}
