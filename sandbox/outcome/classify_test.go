package outcome

import (
	"strings"
	"syscall"
	"testing"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/initproto"
)

// Stderr as node 18 prints it for each kind of failure.
const (
	nodeSyntax = "/work/main.js:1\nfoo(\n    \n\nSyntaxError: Unexpected end of input\n    at internalCompileFunction (node:internal/vm:76:18)\n    at wrapSafe (node:internal/modules/cjs/loader:1283:20)\n\nNode.js v18.20.4\n"
	nodeThrow  = "/work/main.js:1\nfunction f(){ throw new TypeError(\"bad thing\") }\n              ^\n\nTypeError: bad thing\n    at f (/work/main.js:1:21)\n    at Object.<anonymous> (/work/main.js:2:1)\n\nNode.js v18.20.4\n"
	nodeNoMod  = "node:internal/modules/cjs/loader:1080\n  throw err;\n  ^\n\nError: Cannot find module 'lodash/fp'\nRequire stack:\n- /work/main.js\n    at Module._resolveFilename (node:internal/modules/cjs/loader:1077:15)\n    at Object.<anonymous> (/work/main.js:1:1) {\n  code: 'MODULE_NOT_FOUND',\n  requireStack: [ '/work/main.js' ]\n}\n\nNode.js v18.20.4\n"
	nodeNoESM  = "node:internal/errors:496\n    ErrorCaptureStackTrace(err);\n    ^\n\nError [ERR_MODULE_NOT_FOUND]: Cannot find package '@scope/pkg' imported from /work/main.mjs\n    at new NodeError (node:internal/errors:405:5)\n  code: 'ERR_MODULE_NOT_FOUND'\n}\n\nNode.js v18.20.4\n"
	nodeLocal  = "node:internal/modules/cjs/loader:1080\n  throw err;\n  ^\n\nError: Cannot find module './helper'\nRequire stack:\n- /work/main.js\n    at Module._resolveFilename (node:internal/modules/cjs/loader:1077:15)\n\nNode.js v18.20.4\n"
	nodeHeap   = "<--- Last few GCs --->\n\n[1:0x5]     1012 ms: Mark-Compact 150.1 (153.3) -> 149.9 (154.3) MB\n\nFATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory\n 1: 0xb7b3e0 node::Abort() [node]\n"
)

func TestNodeClassifier(t *testing.T) {
	t.Parallel()
	node := classifiers["node"]
	tests := []struct {
		name     string
		e        Ending
		status   job.Status
		category job.Category
		msg      []string
	}{
		{"syntax error", Ending{Init: &initproto.Status{Ready: true, ExitCode: 1}, StderrTail: []byte(nodeSyntax)}, job.StatusFailed, job.CategorySyntaxError, []string{"SyntaxError: Unexpected end of input", "main.js:1"}},
		{"uncaught exception", Ending{Init: &initproto.Status{Ready: true, ExitCode: 1}, StderrTail: []byte(nodeThrow)}, job.StatusFailed, job.CategoryRuntimeError, []string{"uncaught TypeError: bad thing", "main.js:1"}},
		{"missing module", Ending{Init: &initproto.Status{Ready: true, ExitCode: 1}, Runtime: "node", ImageName: "kiln.local/node:latest", StderrTail: []byte(nodeNoMod)}, job.StatusFailed, job.CategoryRuntimeError, []string{`module "lodash" is not installed in the node runtime's image`, "Cannot find module 'lodash/fp'"}},
		{"missing ES package", Ending{Init: &initproto.Status{Ready: true, ExitCode: 1}, Runtime: "node", StderrTail: []byte(nodeNoESM)}, job.StatusFailed, job.CategoryRuntimeError, []string{`module "@scope/pkg"`}},
		{"missing local file is not a package", Ending{Init: &initproto.Status{Ready: true, ExitCode: 1}, StderrTail: []byte(nodeLocal)}, job.StatusFailed, job.CategoryRuntimeError, []string{"uncaught Error: Cannot find module './helper'"}},
		{"V8 heap limit", Ending{Init: &initproto.Status{Ready: true, Signal: int(syscall.SIGABRT)}, MemoryLimit: 64 << 20, StderrTail: []byte(nodeHeap)}, job.StatusFailed, job.CategoryRuntimeError, []string{"64 MB", "heap", "SIGABRT"}},
		{"exit code of its own", Ending{Init: &initproto.Status{Ready: true, ExitCode: 3}, StderrTail: []byte("bye\n")}, job.StatusFailed, job.CategoryRuntimeError, []string{"code 3: bye"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.e.Classifier = node
			status, f, _, _ := Decide(tt.e)
			if status != tt.status || f == nil || f.Category != tt.category {
				t.Fatalf("status %s failure %+v; want %s %s", status, f, tt.status, tt.category)
			}
			for _, m := range tt.msg {
				if !strings.Contains(f.Message, m) {
					t.Errorf("message %q does not contain %q", f.Message, m)
				}
			}
		})
	}
}

func TestMissingModuleNamesTheRuntimeThatHasIt(t *testing.T) {
	t.Parallel()
	e := Ending{
		Init: &initproto.Status{Ready: true, ExitCode: 1}, Runtime: "python-slim", ImageName: "kiln.local/python-slim:latest",
		StderrTail: []byte("Traceback (most recent call last):\n  File \"/work/main.py\", line 1, in <module>\nModuleNotFoundError: No module named 'pandas'\n"),
		Classifier: classifiers["python"],
		HasModule: func(mod string) []string {
			if mod == "pandas" {
				return []string{"python"}
			}
			return nil
		},
	}
	_, f, _, _ := Decide(e)
	want := `module "pandas" is not installed in the python-slim runtime's image (kiln.local/python-slim:latest); only the image's packages can be imported (GET /v1/runtimes lists them); runtime python has it: ModuleNotFoundError: No module named 'pandas'`
	if f == nil || f.Category != job.CategoryRuntimeError || f.Message != want {
		t.Fatalf("failure %+v;\nwant message %s", f, want)
	}
	e.StderrTail = []byte("ModuleNotFoundError: No module named 'torch'\n")
	if _, f, _, _ = Decide(e); strings.Contains(f.Message, "has it") {
		t.Fatalf("message %q names a runtime for a module none has", f.Message)
	}
}
