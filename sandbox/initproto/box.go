package initproto

import (
	"encoding/json"
	"fmt"
)

// A box's zygote (deploy/images/python/box.py) and the worker talk over the
// box's control socket: for each job the worker sends a BoxHeaderSize-byte
// header, "KILN/<version> <n>" space-padded and ending in a newline (the
// version: Protocol), carrying the
// job's ends of its pipes as SCM_RIGHTS (stdin, stdout, stderr, the frame,
// the output channel; a sixth, the egress channel, for a job with a
// network), then n bytes of BoxParams as JSON;
// the zygote answers with one ZygoteReport as a JSON line when the job has
// ended.

// BoxHeaderSize is the fixed size of a job header on the control socket
// (box.py's HEADER_SIZE).
const BoxHeaderSize = 32

// BoxHeader is the header announcing n bytes of BoxParams.
func BoxHeader(n int) []byte {
	return fmt.Appendf(nil, "%s %-*d\n", FrameMagic, BoxHeaderSize-len(FrameMagic)-2, n)
}

// BoxParams is what the zygote makes a job's sandbox of: never its code or
// data (those reach the job's own process only, after the fork, in its
// Frame).
type BoxParams struct {
	// Version is the protocol the worker speaks (Protocol, set by
	// Encode); the zygote refuses another major.
	Version string `json:"v"`
	// UID is the job's uid (and gid) in the box's user namespace, never
	// 0; the job's own user namespace maps it alone.
	UID    int    `json:"uid"`
	Work   string `json:"work"`
	CPUS   uint64 `json:"cpu_s"`
	FSize  int64  `json:"fsize"`
	NoFile int    `json:"nofile"`
	TmpMB  int64  `json:"tmp_mb"`
	RMem   string `json:"rmem"`
	WMem   string `json:"wmem"`
	// EgressPort, when set, asks for the job's proxy listener on that
	// port of the job's loopback, handed back on the sixth descriptor.
	EgressPort int `json:"egress_port,omitempty"`
	// Session: the zygote keeps the inner sandbox and its interpreter
	// between calls (a session's box).
	Session bool `json:"session,omitempty"`
	// Prepare: made ahead of its job, the sandbox waits for the worker's
	// go.
	Prepare bool `json:"prepare,omitempty"`
}

// Encode renders p as the zygote reads it, with the protocol's version.
func (p BoxParams) Encode() ([]byte, error) {
	p.Version = Protocol
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode box parameters: %w", err)
	}
	return b, nil
}

// ZygoteReport is the zygote's JSON line after each job.
type ZygoteReport struct {
	Ready       bool   `json:"ready"`
	ExitCode    int    `json:"exit_code"`
	Signal      int    `json:"signal"`
	Clean       bool   `json:"clean"`
	Error       string `json:"error"`
	LeaseLapsed bool   `json:"lease_lapsed"`
	Killed      bool   `json:"killed"`
	// A session's call (session.py): Fresh, the call started the
	// session's interpreter; Ended, the interpreter is gone after it.
	Fresh bool `json:"fresh"`
	Ended bool `json:"ended"`
}
