package runtimes

import (
	"regexp"
	"slices"
	"strings"
)

// A box's zygote preloads its runtime's list (Profile.Preload), which makes
// every fork of it dearer: a fork copies the page tables of all the memory
// the zygote wrote, and the job's exit frees them. A program that imports
// nothing the list holds gains nothing from it, so it runs in a lean box,
// whose zygote preloads nothing (the sandbox is built the same way; only
// what the interpreter imported before the fork differs).

var (
	// importWord is the keyword import as a word (not __import__).
	importWord = regexp.MustCompile(`(^|[^\w.])import\b`)
	// fromClause is "from X " just before an import keyword.
	fromClause = regexp.MustCompile(`(?:^|[^\w.])from\s+([\w.]+)\s+$`)
	// importList is what follows "import ": dotted names, each with an
	// optional alias, comma-separated, parenthesised or not.
	importList = regexp.MustCompile(`^import\s+\(?\s*([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)`)
	// dynamicImport names the ways to import a module without the
	// keyword that a program writes in the open.
	dynamicImport = regexp.MustCompile(`__import__|\bimportlib\b|\bimport_module\b|\brunpy\b|\bexec\b|\beval\b|\bcompile\b`)
)

// NeedsPreload reports whether a program of the runtime may use a module
// its preload list holds, so that it is to run in a box that preloaded the
// list. Only a python program whose every import statement names a module
// of python's standard library, and that imports nothing any other way,
// does not; every other program (another language, a module of a package
// or of the job's files, an import the scan cannot read) does. Either
// answer is correct: a program in a lean box imports what it uses when it
// uses it.
func (p Profile) NeedsPreload(code string) bool {
	if len(p.Preload) == 0 {
		return false
	}
	if p.Language != "python" {
		return true
	}
	if dynamicImport.MatchString(code) {
		return true
	}
	for _, line := range strings.Split(code, "\n") {
		for _, m := range importWord.FindAllStringSubmatchIndex(line, -1) {
			at := m[3] // the keyword's start, past the character before it
			if f := fromClause.FindStringSubmatch(line[:at]); f != nil {
				if !stdlibModule(f[1]) {
					return true
				}
				continue
			}
			l := importList.FindStringSubmatch(line[at:])
			if l == nil {
				return true // "import" the scan cannot read: a string, a continued line
			}
			for _, part := range strings.Split(l[1], ",") {
				if !stdlibModule(strings.Fields(part)[0]) {
					return true
				}
			}
		}
	}
	return false
}

// stdlibModule reports whether dotted module name mod is of python's
// standard library (a relative import is not).
func stdlibModule(mod string) bool {
	top, _, _ := strings.Cut(mod, ".")
	_, ok := pythonStdlib[top]
	return ok && top != ""
}

// PythonStdlib lists python's standard library by top-level module name,
// sorted.
func PythonStdlib() []string {
	out := make([]string, 0, len(pythonStdlib))
	for m := range pythonStdlib {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}
