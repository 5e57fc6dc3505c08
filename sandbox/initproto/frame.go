package initproto

import (
	"encoding/json"
	"fmt"
)

// FrameMagic starts the one line a launcher reads before the frame's JSON
// body (deploy/images/python/launch.py, the node launcher).
const FrameMagic = "KILN/1"

// Frame is the job as its launcher reads it: "KILN/1 <n>\n" then n bytes
// of this as JSON. The job's stdin follows it on the same pipe.
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
