package initproto

import (
	"encoding/json"
	"fmt"
)

// The launcher protocol's version: what crosses from the worker to a
// launcher (the frame, a box's job header and parameters) and back (a
// zygote's report). A launcher refuses a header of another major version
// with exit code LaunchError and a "kiln-launcher:" line naming both
// versions; a minor version adds only what a launcher of an older minor of
// the same major may ignore. testdata/ holds the shared vectors every side
// reads (this package's tests, the Python and the Node launchers' tests).
//
// Major 2: a box's zygote gives every job a user namespace of its own
// nested in the box's (the jail library, sandbox/jail), the tenant
// boundary inside a box; a worker must never hand a job to a zygote of
// major 1, which makes none, and a zygote of major 1 refuses every header
// of major 2 ("job header does not start with KILN/1").
const (
	ProtocolMajor = 2
	ProtocolMinor = 0
	// Protocol is "major.minor", as headers and BoxParams carry it.
	Protocol = "2.0"
)

// FrameMagic starts the one line a launcher reads before the frame's JSON
// body (deploy/images/python/launch.py, the node launcher), and a box's
// job header: "KILN/" and the protocol version.
const FrameMagic = "KILN/" + Protocol

// LaunchError is a launcher's exit code for what is the platform's fault
// and never the program's: a frame it cannot read, a protocol version it
// does not speak, a sandbox it could not make. It says so on stderr in a
// line that starts with "kiln-launcher:".
const LaunchError = 125

// Frame is the job as its launcher reads it: "KILN/<version> <n>\n" then n
// bytes of this as JSON. The job's stdin follows it on the same pipe.
type Frame struct {
	Code  string            `json:"code"`
	Args  []string          `json:"args"`
	Env   map[string]string `json:"env"`
	Files []FrameFile       `json:"files"`
	// CPUSeconds is the job's RLIMIT_CPU when the launcher must set it
	// itself; 0 where the sandbox's spec sets it.
	CPUSeconds int64 `json:"cpu_s,omitempty"`
}

// FrameFile is one input file of a Frame.
type FrameFile struct {
	Name string `json:"name"`
	Data []byte `json:"data"` // standard base64 in JSON
}

// Encode renders f as the launcher reads it: the header line, then the
// JSON body. A nil Args or Env is sent empty, never null.
func (f Frame) Encode() ([]byte, error) {
	if f.Args == nil {
		f.Args = []string{}
	}
	if f.Env == nil {
		f.Env = map[string]string{}
	}
	if f.Files == nil {
		f.Files = []FrameFile{}
	}
	js, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("encode job frame: %w", err)
	}
	head := fmt.Appendf(nil, "%s %d\n", FrameMagic, len(js))
	return append(head, js...), nil
}
