package sandbox

import (
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/initproto"
)

// encodeFrame builds the launcher's frame (initproto.Frame) of a validated
// spec: "KILN/<version> <n>\n<n bytes of JSON>". The job's stdin follows it
// on the same pipe.
func encodeFrame(spec job.Spec) ([]byte, error) {
	f := initproto.Frame{Code: spec.Code, Args: spec.Args, Env: spec.Env, Files: make([]initproto.FrameFile, 0, len(spec.Files))}
	for _, file := range spec.Files {
		b, err := file.Bytes()
		if err != nil {
			return nil, &job.InvalidError{Field: "files", Message: err.Error()}
		}
		f.Files = append(f.Files, initproto.FrameFile{Name: file.Name, Data: b})
	}
	return f.Encode()
}
