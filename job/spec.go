package job

import (
	"encoding/base64"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
)

// Spec is one job as a client submits it. JSON field names are public API.
type Spec struct {
	// Runtime names the sandbox runtime, e.g. "python". Default: DefaultRuntime.
	Runtime string `json:"runtime,omitempty"`
	// Code is the program source. Required.
	Code string `json:"code"`
	// Stdin is fed to the program's standard input.
	Stdin string `json:"stdin,omitempty"`
	// Args are passed to the program (sys.argv[1:] for Python).
	Args []string `json:"args,omitempty"`
	// Env adds variables to the sandbox environment. Names must not collide
	// with the fixed allowlist (PATH, HOME, LANG, ...).
	Env map[string]string `json:"env,omitempty"`
	// Files are placed in the working directory before the program starts.
	Files []File `json:"files,omitempty"`
	// Limits override the server defaults; zero fields take the default.
	Limits Limits `json:"limits,omitempty"`
	// Cache is false, true or {"max_age_s": N} (see CachePolicy). nil or true
	// lets an identical earlier run no older than the server's default max
	// age answer; false always runs.
	Cache *CachePolicy `json:"cache,omitempty"`
	// CallbackURL, when set, receives the Result in a signed POST once the
	// job ends (see package callback). Not part of the cache key.
	CallbackURL string `json:"callback_url,omitempty"`
	// Budget names a budget of the caller's (POST /v1/budgets) the job's
	// run is charged to; one that cannot cover the job's limits refuses it
	// (ProblemBudgetExhausted). Not part of the cache key.
	Budget string `json:"budget,omitempty"`
	// Network allows the job to reach the named hosts through its egress
	// proxy (within its tenant's allowance); nil: no network.
	Network *Network `json:"network,omitempty"`
	// Metadata is the caller's own labels on the job (see Metadata),
	// returned with it and filterable in listings. Not part of the cache
	// key.
	Metadata Metadata `json:"metadata,omitempty"`
}

// File is an input file placed in the job's working directory.
type File struct {
	// Name is a relative path inside the working directory ("data/in.csv").
	Name string `json:"name"`
	// Content is the file's content: UTF-8 text, or base64 when Encoding is "base64".
	Content string `json:"content"`
	// Encoding is "" (UTF-8 text) or "base64".
	Encoding string `json:"encoding,omitempty"`
}

// Bytes returns the file's decoded content.
func (f File) Bytes() ([]byte, error) {
	switch f.Encoding {
	case "", "utf-8", "utf8":
		return []byte(f.Content), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(f.Content)
		if err != nil {
			return nil, fmt.Errorf("file %q: content is not valid base64: %w", f.Name, err)
		}
		return b, nil
	default:
		return nil, fmt.Errorf("file %q: unknown encoding %q (use \"\" or \"base64\")", f.Name, f.Encoding)
	}
}

// CacheEnabled reports whether the job may be answered from, and stored in,
// the result cache. A job with a network must ask for it (true or
// {"max_age_s": N}): what a host answers can change between runs, so by
// default such a job always runs.
func (s Spec) CacheEnabled() bool {
	if !s.Network.Empty() {
		return s.Cache != nil && !s.Cache.Off
	}
	return s.Cache == nil || !s.Cache.Off
}

// Bounds on the parts of a spec that limits do not cover.
const (
	DefaultRuntime  = "python"
	MaxCodeBytes    = 1 << 20 // 1 MiB of source
	MaxStdinBytes   = 8 << 20 // 8 MiB of stdin
	MaxFiles        = 64
	MaxFilesBytes   = 16 << 20 // all input files together, decoded
	MaxArgs         = 256
	MaxArgBytes     = 64 << 10
	MaxEnvVars      = 64
	MaxEnvBytes     = 64 << 10
	MaxFileNameLen  = 255
	MaxSpecJSONSize = 32 << 20 // request bodies above this are refused
)

// ReservedEnv are variables every sandbox sets itself; a spec may not
// override them. Each runtime reserves its own on top (RuntimeContract).
var ReservedEnv = []string{"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "HOSTNAME"}

// Validate checks everything about the spec except limits (see Policy.Resolve)
// and the runtime name (see ValidateRuntime). The error is an *InvalidError
// naming the field and what to fix.
func (s Spec) Validate() error {
	if strings.TrimSpace(s.Code) == "" {
		return invalid("code", "code is empty: send the program source in \"code\"")
	}
	if len(s.Code) > MaxCodeBytes {
		return invalid("code", fmt.Sprintf("code is %d bytes; the maximum is %d", len(s.Code), MaxCodeBytes))
	}
	if !utf8.ValidString(s.Code) {
		return invalid("code", "code is not valid UTF-8")
	}
	if strings.IndexByte(s.Code, 0) >= 0 {
		return invalid("code", "code contains a NUL byte")
	}
	if len(s.Stdin) > MaxStdinBytes {
		return invalid("stdin", fmt.Sprintf("stdin is %d bytes; the maximum is %d", len(s.Stdin), MaxStdinBytes))
	}
	if len(s.Args) > MaxArgs {
		return invalid("args", fmt.Sprintf("%d args; the maximum is %d", len(s.Args), MaxArgs))
	}
	total := 0
	for i, a := range s.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return invalid("args", fmt.Sprintf("args[%d] contains a NUL byte", i))
		}
		total += len(a)
	}
	if total > MaxArgBytes {
		return invalid("args", fmt.Sprintf("args total %d bytes; the maximum is %d", total, MaxArgBytes))
	}
	if err := validateEnv(s.Env); err != nil {
		return err
	}
	if err := validateCallbackURL(s.CallbackURL); err != nil {
		return err
	}
	if err := ValidateMetadata("metadata", s.Metadata); err != nil {
		return err
	}
	return validateFiles(s.Files)
}

func validateEnv(env map[string]string) error {
	if len(env) > MaxEnvVars {
		return invalid("env", fmt.Sprintf("%d variables; the maximum is %d", len(env), MaxEnvVars))
	}
	total := 0
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return invalid("env", fmt.Sprintf("variable name %q is not valid: it must be non-empty and hold no '=' or NUL", k))
		}
		if strings.IndexByte(v, 0) >= 0 {
			return invalid("env", fmt.Sprintf("variable %s holds a NUL byte", k))
		}
		for _, r := range ReservedEnv {
			if k == r {
				return invalid("env", fmt.Sprintf("variable %s is set by the sandbox and cannot be overridden (reserved: %s)", k, strings.Join(ReservedEnv, ", ")))
			}
		}
		if strings.HasPrefix(k, "KILN_") {
			return invalid("env", fmt.Sprintf("variable %s: names starting with KILN_ are reserved", k))
		}
		total += len(k) + len(v)
	}
	if total > MaxEnvBytes {
		return invalid("env", fmt.Sprintf("env totals %d bytes; the maximum is %d", total, MaxEnvBytes))
	}
	return nil
}

func validateFiles(files []File) error {
	if len(files) > MaxFiles {
		return invalid("files", fmt.Sprintf("%d files; the maximum is %d", len(files), MaxFiles))
	}
	seen := make(map[string]bool, len(files))
	total := 0
	for i, f := range files {
		field := fmt.Sprintf("files[%d].name", i)
		if err := ValidFileName(f.Name); err != nil {
			return invalid(field, err.Error())
		}
		clean := path.Clean(f.Name)
		if seen[clean] {
			return invalid(field, fmt.Sprintf("file %q is listed twice", f.Name))
		}
		seen[clean] = true
		b, err := f.Bytes()
		if err != nil {
			return invalid(fmt.Sprintf("files[%d].content", i), err.Error())
		}
		total += len(b)
	}
	if total > MaxFilesBytes {
		return invalid("files", fmt.Sprintf("files total %d bytes; the maximum is %d", total, MaxFilesBytes))
	}
	return fileCollision(files, seen)
}

// fileCollision refuses a name that another input file (or the program's
// needs as a directory (the program's own file: RuntimeContract.ValidateFor): "a" and "a/b" cannot both exist,
// whichever comes first, so the launcher could not materialise the job.
func fileCollision(files []File, names map[string]bool) error {
	for i, f := range files {
		clean := path.Clean(f.Name)
		for dir := path.Dir(clean); dir != "."; dir = path.Dir(dir) {
			if names[dir] {
				return invalid(fmt.Sprintf("files[%d].name", i), fmt.Sprintf("file %q needs %q to be a directory, but %q is also an input file; rename one of them", f.Name, dir, dir))
			}
		}
	}
	return nil
}

// FitsLimits checks what depends on both the spec and its resolved limits:
// the input files and the program must fit in the work dir's disk_mb (or the
// launcher could not write them), with a page of slack per file.
func (s Spec) FitsLimits(l Limits) error {
	need := int64(len(s.Code)) + 4096
	for _, f := range s.Files {
		b, err := f.Bytes()
		if err != nil {
			return invalid("files", err.Error())
		}
		need += int64(len(b)) + 4096
	}
	if need > l.DiskMB<<20 {
		return invalid("limits.disk_mb", fmt.Sprintf("the program and input files need %d bytes in the work dir, above disk_mb %d; raise limits.disk_mb or send less", need, l.DiskMB))
	}
	return nil
}

// ValidFileName reports whether name is a safe relative path for an input file:
// no absolute path, no "..", no empty or dot segments, no NUL, at most MaxFileNameLen bytes.
func ValidFileName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("file name is empty")
	case len(name) > MaxFileNameLen:
		return fmt.Errorf("file name %q is longer than %d bytes", name, MaxFileNameLen)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("file name %q contains a NUL byte", name)
	case strings.HasPrefix(name, "/"):
		return fmt.Errorf("file name %q is absolute; use a path relative to the working directory", name)
	case strings.Contains(name, "\\"):
		return fmt.Errorf("file name %q contains a backslash; use '/' as the separator", name)
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("file name %q has an empty, '.' or '..' segment", name)
		}
	}
	return nil
}

// ValidateRuntime checks name against the known runtimes; the error lists them.
func ValidateRuntime(name string, known []string) error {
	for _, k := range known {
		if k == name {
			return nil
		}
	}
	return invalid("runtime", fmt.Sprintf("unknown runtime %q; known runtimes: %s", name, strings.Join(known, ", ")))
}

// Normalize fills defaults that do not depend on server policy (the runtime name).
func (s *Spec) Normalize() {
	if s.Runtime == "" {
		s.Runtime = DefaultRuntime
	}
}
