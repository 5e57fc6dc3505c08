package outcome

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/kilnrun/kiln/job"
)

// A Classifier reads what a runtime's interpreter prints when a program
// fails, so a client gets a category and a one-line message instead of
// having to parse a traceback. A runtime profile names its classifier; a new
// language whose interpreter prints differently registers one here.
type Classifier struct {
	// OutOfMemory reports whether the interpreter itself says an allocation
	// was refused (Python's MemoryError, V8's heap limit): the memory limit
	// seen from inside, before the kernel had to kill.
	OutOfMemory func(tail []byte) bool
	// Failure reads the stderr tail of a program that exited non-zero; ok is
	// false when it recognises nothing there.
	Failure func(tail []byte) (v Verdict, ok bool)
}

// Verdict is a classifier's reading of a failure.
type Verdict struct {
	Category job.Category
	Message  string
	// Module is the module a program tried to import and the image lacks.
	Module string
}

// classifiers by the name a runtime profile gives.
var classifiers = map[string]Classifier{
	"python": {OutOfMemory: pythonOutOfMemory, Failure: pythonFailure},
	"node":   {OutOfMemory: nodeOutOfMemory, Failure: nodeFailure},
}

// ClassifierFor is the classifier a runtime profile names; ok is false for
// a name none is registered under (the zero Classifier refines nothing).
func ClassifierFor(name string) (c Classifier, ok bool) {
	c, ok = classifiers[name]
	return c, ok
}

// ClassifierNames lists the registered classifiers, sorted.
func ClassifierNames() []string {
	names := make([]string, 0, len(classifiers))
	for n := range classifiers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// --- python -------------------------------------------------------------

var pythonNoModule = regexp.MustCompile(`^ModuleNotFoundError: No module named '([^']+)'`)

func pythonOutOfMemory(tail []byte) bool {
	return bytes.HasPrefix(LastLine(tail), []byte("MemoryError"))
}

func pythonFailure(tail []byte) (Verdict, bool) {
	last := LastLine(tail)
	for _, p := range [][]byte{[]byte("SyntaxError:"), []byte("IndentationError:"), []byte("TabError:")} {
		if bytes.HasPrefix(last, p) {
			return Verdict{Category: job.CategorySyntaxError, Message: string(last)}, true
		}
	}
	if m := pythonNoModule.FindSubmatch(last); m != nil {
		mod, _, _ := strings.Cut(string(m[1]), ".")
		return Verdict{Category: job.CategoryRuntimeError, Message: string(last), Module: mod}, true
	}
	return Verdict{}, false
}

// --- node ---------------------------------------------------------------

var (
	// "TypeError: x", "Error [ERR_MODULE_NOT_FOUND]: Cannot find package ...",
	// "ReferenceError: foo is not defined"; a line the stack trace follows.
	nodeErrorLine = regexp.MustCompile(`^([A-Za-z_$][\w$]*)(?: \[([A-Z0-9_]+)\])?(?:: (.*))?$`)
	// The code frame's first line: "/work/main.js:3" or "file:///work/main.mjs:3".
	nodeLocation  = regexp.MustCompile(`^(?:file://)?(/work/[^\s:]+):(\d+)$`)
	nodeNoModule  = regexp.MustCompile(`Cannot find (?:module|package) '([^']+)'`)
	nodeHeapLimit = []byte("JavaScript heap out of memory")
)

func nodeOutOfMemory(tail []byte) bool {
	return bytes.Contains(tail, nodeHeapLimit)
}

// nodeFailure reads node's report of an uncaught error:
//
//	/work/main.js:2
//	    throw new TypeError("bad");
//	    ^
//
//	TypeError: bad
//	    at Object.<anonymous> (/work/main.js:2:11)
//	    ...
//
//	Node.js v18.20.4
func nodeFailure(tail []byte) (Verdict, bool) {
	lines := strings.Split(strings.ToValidUTF8(string(tail), "\uFFFD"), "\n")
	where := ""
	errLine := ""
	for i, l := range lines {
		l = strings.TrimRight(l, "\r")
		if m := nodeLocation.FindStringSubmatch(l); m != nil && where == "" {
			where = strings.TrimPrefix(m[1], "/work/") + ":" + m[2]
		}
		if i+1 < len(lines) && (strings.HasPrefix(lines[i+1], "    at ") || strings.HasPrefix(lines[i+1], "Require stack:")) && nodeErrorLine.MatchString(l) {
			errLine = l
			break
		}
	}
	if errLine == "" {
		return Verdict{}, false
	}
	if len(errLine) > 1024 {
		errLine = errLine[:1024]
	}
	m := nodeErrorLine.FindStringSubmatch(errLine)
	class := m[1]
	msg := errLine
	if where != "" {
		msg += " (" + where + ")"
	}
	if class == "SyntaxError" {
		return Verdict{Category: job.CategorySyntaxError, Message: msg}, true
	}
	if mm := nodeNoModule.FindStringSubmatch(errLine); mm != nil {
		if mod := nodePackageName(mm[1]); mod != "" {
			return Verdict{Category: job.CategoryRuntimeError, Message: errLine, Module: mod}, true
		}
	}
	return Verdict{Category: job.CategoryRuntimeError, Message: fmt.Sprintf("uncaught %s", msg)}, true
}

// nodePackageName is the package a bare specifier names ("lodash" for
// "lodash/fp", "@scope/pkg" for "@scope/pkg/x"); "" for a path.
func nodePackageName(spec string) string {
	if spec == "" || strings.HasPrefix(spec, ".") || strings.HasPrefix(spec, "/") || strings.Contains(spec, ":") {
		return ""
	}
	parts := strings.Split(spec, "/")
	if strings.HasPrefix(spec, "@") && len(parts) > 1 {
		return parts[0] + "/" + parts[1]
	}
	return parts[0]
}
