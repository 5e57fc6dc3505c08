package runtimes

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/outcome"
)

// Image config labels deploy/images/build.sh writes from a recipe folder.
const (
	// LabelProfile holds the runtime profile: the recipe's runtime.json.
	LabelProfile = "kiln.runtime.profile"
	// LabelPackages holds what the image can import, as listed at build
	// time: {"language","version","packages":[{"name","version","modules"}]}.
	LabelPackages = "kiln.runtime.packages"
)

// heapPlaceholder in an interpreter flag is replaced by the V8 (or other)
// heap size in MiB derived from the job's memory limit.
const heapPlaceholder = "{heap_mb}"

// Profile is a language runtime as data: what the sandbox needs to know to
// run a program in it. It lives next to the image recipe
// (deploy/images/<name>/runtime.json) and travels inside the image as the
// LabelProfile label, so the worker runs exactly the profile the image was
// built with, and adding a runtime that speaks the launcher's frame protocol
// needs no Go change (unless it needs a new error classifier).
type Profile struct {
	// Name is the runtime's name, the recipe folder's.
	Name string `json:"name"`
	// Language is the language it runs ("python", "javascript").
	Language string `json:"language"`
	// MainFile is the name the launcher writes the program to in /work.
	MainFile string `json:"main_file"`
	// ReservedFiles are further names the launcher may write the program to
	// (node's main.mjs for an ES module).
	ReservedFiles []string `json:"reserved_files,omitempty"`
	// InterpreterFlags go right after the first word of the image's
	// entrypoint (the interpreter). "{heap_mb}" in a flag is replaced by
	// HeapPercent of the job's memory limit, in MiB.
	InterpreterFlags []string `json:"interpreter_flags,omitempty"`
	// HeapPercent is the share of the memory limit "{heap_mb}" stands for.
	// Default: 75 (the rest is the interpreter itself, buffers and code).
	HeapPercent int64 `json:"heap_percent,omitempty"`
	// Env is the runtime's fixed environment ("NAME=value"), added to every
	// sandbox's (Rules.BaseEnv); a job may not override these names.
	Env []string `json:"env,omitempty"`
	// ReservedEnv are further names a job may not set.
	ReservedEnv []string `json:"reserved_env,omitempty"`
	// Classifier names how the program's stderr is read for a failure's
	// category and message (the classifiers of package outcome).
	Classifier string `json:"classifier"`
	// Preload lists modules a pooled sandbox imports before its job arrives.
	Preload []string `json:"preload"`
	// Limits are the runtime's default limits; zero fields: the server's.
	Limits job.Limits `json:"limits"`
	// Isolation is what the runtime's sandboxes run under: "runc" (the
	// host kernel behind seccomp) or "gvisor" (gVisor's user-space kernel,
	// runsc). Default: "runc". A worker may override it per runtime
	// (the sandbox's Config.Isolation); a job cannot choose it.
	Isolation string `json:"isolation,omitempty"`
	// Box says the launcher can supervise a box (the sandbox's BoxConfig):
	// a zygote that forks every job into a fresh inner sandbox. Default:
	// false.
	Box bool `json:"box,omitempty"`
	// SessionLauncher, for a runtime whose jobs do not run in boxes, is
	// the process a session's box starts instead of the image's entrypoint:
	// a box supervisor (python's, in the node image) whose session
	// interpreter runs the runtime's own launcher (SessionInterpreter).
	// Empty: sessions of the runtime need Box.
	SessionLauncher []string `json:"session_launcher,omitempty"`
}

// HostsSessions reports whether the runtime's image can host a session's
// box: its launcher supervises boxes, or it has a session launcher.
func (p Profile) HostsSessions() bool { return p.Box || len(p.SessionLauncher) > 0 }

// SessionInterpreter is what a session's box runs as its interpreter when
// the profile has a SessionLauncher: the image's own launcher (entrypoint,
// with the interpreter flags for memoryMB), told to serve calls. Nil for a
// runtime whose box supervisor is its interpreter.
func (p Profile) SessionInterpreter(entrypoint []string, memoryMB int64) []string {
	if len(p.SessionLauncher) == 0 {
		return nil
	}
	return p.LaunchArgs(entrypoint, memoryMB)
}

// HeapPercentDefault is Profile.HeapPercent's default.
const HeapPercentDefault = 75

// Rules are what the sandbox fixes for every runtime, which a profile is
// checked against.
type Rules struct {
	// BaseEnv is the environment of every sandbox ("NAME=value"); a
	// profile may not set these names.
	BaseEnv []string
	// Isolation checks an isolation name ("" stands for the default);
	// nil accepts every name.
	Isolation func(string) error
}

// Parse reads a LabelProfile value and checks it against rules.
func Parse(raw string, rules Rules) (Profile, error) {
	var p Profile
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Profile{}, fmt.Errorf("runtime profile: %w", err)
	}
	return p, p.Validate(rules)
}

// Validate checks a profile against rules: its names, its heap share, its
// isolation, its files (valid job file names), its classifier (one package
// outcome knows) and its env (NAME=value, no name of rules.BaseEnv).
func (p Profile) Validate(rules Rules) error {
	switch {
	case p.Name == "":
		return fmt.Errorf("runtime profile: name is empty")
	case p.Language == "":
		return fmt.Errorf("runtime profile %s: language is empty", p.Name)
	case p.HeapPercent < 0 || p.HeapPercent > 100:
		return fmt.Errorf("runtime profile %s: heap_percent %d must be between 1 and 100", p.Name, p.HeapPercent)
	}
	if rules.Isolation != nil {
		if err := rules.Isolation(p.Isolation); err != nil {
			return fmt.Errorf("runtime profile %s: %w", p.Name, err)
		}
	}
	for _, f := range append([]string{p.MainFile}, p.ReservedFiles...) {
		if err := job.ValidFileName(f); err != nil {
			return fmt.Errorf("runtime profile %s: main or reserved file: %w", p.Name, err)
		}
	}
	for _, w := range p.SessionLauncher {
		if w == "" {
			return fmt.Errorf("runtime profile %s: session_launcher has an empty word", p.Name)
		}
	}
	if _, ok := outcome.ClassifierFor(p.Classifier); !ok {
		return fmt.Errorf("runtime profile %s: unknown classifier %q (known: %s)", p.Name, p.Classifier, strings.Join(outcome.ClassifierNames(), ", "))
	}
	base := envNames(rules.BaseEnv)
	for _, kv := range p.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("runtime profile %s: env entry %q is not NAME=value", p.Name, kv)
		}
		if slices.Contains(base, k) {
			return fmt.Errorf("runtime profile %s: env %s is set by every sandbox and cannot be changed per runtime", p.Name, k)
		}
	}
	return nil
}

// LaunchArgs is the process the sandbox starts: the image's entrypoint with
// the interpreter flags after its first word, for a job with memory limit
// memoryMB.
func (p Profile) LaunchArgs(entrypoint []string, memoryMB int64) []string {
	if len(entrypoint) == 0 {
		return nil
	}
	heap := strconv.FormatInt(max(memoryMB*cmp.Or(p.HeapPercent, HeapPercentDefault)/100, 16), 10)
	args := []string{entrypoint[0]}
	for _, f := range p.InterpreterFlags {
		args = append(args, strings.ReplaceAll(f, heapPlaceholder, heap))
	}
	return append(args, entrypoint[1:]...)
}

// Contract is what clients and the API need of the profile and the image's
// package list (job.RuntimeContract).
func (p Profile) Contract(pk Packages) job.RuntimeContract {
	return job.RuntimeContract{
		Language:      p.Language,
		Version:       pk.Version,
		MainFile:      p.MainFile,
		ReservedFiles: slices.Clone(p.ReservedFiles),
		ReservedEnv:   append(envNames(p.Env), p.ReservedEnv...),
		DefaultLimits: p.Limits,
		Packages:      pk.Packages,
	}
}

// HeapFlagged reports whether the launcher's flags depend on the memory
// limit ("{heap_mb}"), which then must be fixed when the sandbox is created.
func (p Profile) HeapFlagged() bool {
	for _, f := range p.InterpreterFlags {
		if strings.Contains(f, heapPlaceholder) {
			return true
		}
	}
	return false
}

func envNames(env []string) []string {
	names := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		names = append(names, k)
	}
	return names
}
