package initproto

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
)

// Environment variables. The KILN_INIT_ ones are for kiln-init only and
// never reach the launcher.
const (
	EnvNonce     = "KILN_INIT_NONCE"      // hex secret the status must carry
	EnvStatus    = "KILN_INIT_STATUS"     // path of the status file in the container
	EnvIdleMS    = "KILN_INIT_IDLE_MS"    // limit on the wait for readiness, ms
	EnvTimeoutMS = "KILN_INIT_TIMEOUT_MS" // wall-clock limit after readiness, ms
	EnvPrefix    = "KILN_INIT_"
	// EnvRunAs, when set ("uid:gid"), is the user the launcher runs as,
	// while kiln-init keeps the container's own (a container of its own:
	// the supervisor's uid, which no process of the job can act on).
	EnvRunAs = "KILN_INIT_RUN_AS"
	// EnvJobPidNS, when set with EnvRunAs, has kiln-init start the
	// launcher in a pid and mount namespace of the job's own, with a
	// /proc of its own, so no task of kiln-init's is in the job's view
	// (gVisor, whose kernel lets some calls through across uids). It
	// needs CAP_SYS_ADMIN besides the supervisor's capabilities.
	EnvJobPidNS = "KILN_INIT_JOB_PIDNS"
	// EnvOutputs, when set, is the path of the output channel's file in
	// the container: kiln-init opens it for appending and hands it to the
	// launcher as descriptor OutputFD, named in EnvOutputFD (display
	// outputs and the exception, as JSON lines; see the Python launcher).
	EnvOutputs = "KILN_INIT_OUTPUTS"
	// EnvOutputFD names the launcher's output channel descriptor.
	EnvOutputFD = "KILN_OUTPUT_FD"
	// OutputFD is the output channel's descriptor number in the launcher.
	OutputFD = 4
	// EnvReadyFD names the launcher's readiness descriptor (its value is "3").
	EnvReadyFD = "KILN_READY_FD"
	// ReadyFD is the readiness descriptor's number in the launcher.
	ReadyFD = 3
)

// Version is the status format this package reads and writes.
const Version = 1

// MaxStatusBytes bounds what the worker reads of a status file.
const MaxStatusBytes = 4096

// Status is how the launcher really ended, as kiln-init saw it.
type Status struct {
	Version int    `json:"v"`
	Nonce   string `json:"nonce"`
	// Ready reports the launcher signalled readiness: the job's code ran.
	Ready bool `json:"ready"`
	// Signal is the signal number that killed the launcher, 0 if it exited.
	Signal int `json:"signal"`
	// ExitCode is the launcher's exit code when Signal is 0.
	ExitCode int `json:"exit_code"`
	// CPUMicros is the launcher's user+system CPU time (with its reaped
	// children's), from wait4's rusage.
	CPUMicros int64 `json:"cpu_us"`
	// TimedOut reports kiln-init killed everything at its own limit
	// (EnvIdleMS before readiness, EnvTimeoutMS after).
	TimedOut bool `json:"timed_out"`
}

// Encode renders s for the status file.
func (s Status) Encode() []byte {
	s.Version = Version
	b, _ := json.Marshal(s) // a struct of plain fields always marshals
	return append(b, '\n')
}

// ErrForged is returned by Parse for a status that does not carry the nonce.
var ErrForged = errors.New("status does not carry the sandbox's nonce")

// Parse decodes a status file's content and checks its nonce.
func Parse(b []byte, nonce string) (Status, error) {
	var s Status
	if len(b) == 0 {
		return s, errors.New("no status was written")
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("decode status: %w", err)
	}
	if s.Version != Version {
		return s, fmt.Errorf("status version %d, want %d", s.Version, Version)
	}
	if nonce == "" || subtle.ConstantTimeCompare([]byte(s.Nonce), []byte(nonce)) != 1 {
		return s, ErrForged
	}
	return s, nil
}
