// Package initproto is the contract between the sandbox runtime (the worker),
// kiln-init (the sandbox's pid 1) and a runtime's launcher: the variables the
// worker passes the init, the readiness descriptor the init passes the
// launcher, and the status report the init leaves for the worker. It is a
// leaf: kiln-init is a static binary and imports nothing else of Kiln.
//
// The protocol, in order:
//
//  1. The worker starts the container with kiln-init as its process and the
//     launcher's command line as kiln-init's arguments, and sets EnvNonce (a
//     fresh random secret per sandbox), EnvStatus (the path of the status
//     file, a host file bind-mounted into the container), EnvIdleMS and
//     EnvTimeoutMS in the process environment.
//  2. kiln-init makes itself non-dumpable (so no process of the job can read
//     /proc/1/environ, mem or fd, nor ptrace it), opens the status file,
//     removes every KILN_INIT_* variable from its environment, and starts the
//     launcher with a pipe's write end as descriptor ReadyFD, named in
//     EnvReadyFD.
//  3. The launcher reads the job, writes its input files, then writes one
//     byte to descriptor ReadyFD and closes it, before any code of the job
//     runs. A launcher that fails before that point is the platform's fault
//     (internal_error); anything after it is the program's.
//  4. kiln-init forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and
//     SIGUSR2 to the launcher, reaps every orphan, and kills everything
//     (kill(-1, SIGKILL)) when EnvIdleMS passes without readiness or
//     EnvTimeoutMS passes after it.
//  5. When the launcher has exited, kiln-init kills every other process,
//     reaps until none is left, then truncates the status file and writes one
//     Status as JSON, carrying the nonce. The job cannot forge it: it never
//     sees the nonce, and it is dead before the status is written. The worker
//     ignores a status without the right nonce.
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
