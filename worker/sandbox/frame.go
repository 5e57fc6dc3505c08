package sandbox

import (
	"encoding/json"
	"fmt"

	"github.com/kilnrun/kiln/job"
)

// frameMagic starts the one line the launcher reads before the JSON body.
const frameMagic = "KILN/1"

// frameBody is the JSON the launcher (deploy/images/python/launch.py) reads.
type frameBody struct {
	Code  string            `json:"code"`
	Args  []string          `json:"args"`
	Env   map[string]string `json:"env"`
	Files []frameFile       `json:"files"`
	// CPUSeconds is the job's RLIMIT_CPU, which a recycled sandbox's
	// zygote sets in the job's process (0 elsewhere: the spec sets it).
	CPUSeconds int64 `json:"cpu_s,omitempty"`
}

type frameFile struct {
	Name string `json:"name"`
	Data []byte `json:"data"` // standard base64 in JSON
}

// encodeFrame builds "KILN/1 <n>\n<n bytes of JSON>" for a validated spec.
// The job's stdin follows it on the same pipe.
func encodeFrame(spec job.Spec) ([]byte, error) {
	js, err := frameJSON(spec, 0)
	if err != nil {
		return nil, err
	}
	head := fmt.Appendf(nil, "%s %d\n", frameMagic, len(js))
	return append(head, js...), nil
}

// frameJSON is the frame's JSON body.
func frameJSON(spec job.Spec, cpuSeconds int64) ([]byte, error) {
	body := frameBody{Code: spec.Code, Args: spec.Args, Env: spec.Env, Files: make([]frameFile, 0, len(spec.Files))}
	if body.Args == nil {
		body.Args = []string{}
	}
	if body.Env == nil {
		body.Env = map[string]string{}
	}
	for _, f := range spec.Files {
		b, err := f.Bytes()
		if err != nil {
			return nil, &job.InvalidError{Field: "files", Message: err.Error()}
		}
		body.Files = append(body.Files, frameFile{Name: f.Name, Data: b})
	}
	body.CPUSeconds = cpuSeconds
	js, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode job frame: %w", err)
	}
	return js, nil
}
