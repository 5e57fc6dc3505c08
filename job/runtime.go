package job

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// RuntimeContract is what a client must know of a runtime to write a job for
// it: the parts of the runtime's profile (deploy/images/<name>/runtime.json)
// that validation needs, and what its image can import. It is data a worker
// advertises, so job/ knows no language.
type RuntimeContract struct {
	// Language is the language the runtime runs ("python", "javascript").
	Language string `json:"language,omitempty"`
	// Version is the language implementation's version ("3.11.2", "18.20.4").
	Version string `json:"version,omitempty"`
	// MainFile is the name the program's code gets in the working directory
	// ("main.py"); no input file may take it.
	MainFile string `json:"main_file,omitempty"`
	// ReservedFiles are further names the launcher may write the program to.
	ReservedFiles []string `json:"reserved_files,omitempty"`
	// ReservedEnv are the variables this runtime's sandbox sets itself, on
	// top of ReservedEnv; a spec may not set them.
	ReservedEnv []string `json:"reserved_env,omitempty"`
	// DefaultLimits are the runtime's own defaults for limits a spec leaves
	// at zero (a zero field: the server's default), within the maximum.
	DefaultLimits Limits `json:"default_limits,omitempty"`
	// Packages are what a program can import besides the standard library.
	Packages []Package `json:"packages,omitempty"`
	// Sessions: the runtime's sandboxes keep an interpreter between calls
	// (POST /v1/sessions takes it). Nil from workers of earlier versions,
	// which did not say.
	Sessions *bool `json:"sessions,omitempty"`
}

// Package is one installed package a runtime's programs can import.
type Package struct {
	// Name is the package's distribution name ("scikit-learn").
	Name string `json:"name"`
	// Version is its installed version.
	Version string `json:"version"`
	// Modules are the top-level names a program imports ("sklearn").
	Modules []string `json:"modules,omitempty"`
}

// Provides reports whether one of the packages has the top-level module mod.
func (c RuntimeContract) Provides(mod string) bool {
	for _, p := range c.Packages {
		if slices.Contains(p.Modules, mod) {
			return true
		}
	}
	return false
}

// ValidateFor checks what depends on the runtime: no input file takes the
// program's own file name, and env sets none of the runtime's reserved
// variables. The error is an *InvalidError naming the field.
func (s Spec) ValidateFor(c RuntimeContract) error {
	for i, f := range s.Files {
		name := path.Clean(f.Name)
		if (c.MainFile != "" && name == c.MainFile) || slices.Contains(c.ReservedFiles, name) {
			return invalid(fmt.Sprintf("files[%d].name", i), fmt.Sprintf("file name %q is reserved for the program itself in runtime %s", f.Name, s.Runtime))
		}
		for dir := path.Dir(name); dir != "." && dir != "/"; dir = path.Dir(dir) {
			if (c.MainFile != "" && dir == c.MainFile) || slices.Contains(c.ReservedFiles, dir) {
				return invalid(fmt.Sprintf("files[%d].name", i), fmt.Sprintf("file %q needs %q to be a directory, but that is the program's own file in runtime %s", f.Name, dir, s.Runtime))
			}
		}
	}
	for k := range s.Env {
		if slices.Contains(c.ReservedEnv, k) {
			return invalid("env", fmt.Sprintf("variable %s is set by the %s runtime's sandbox and cannot be overridden (reserved: %s)",
				k, s.Runtime, strings.Join(append(slices.Clone(ReservedEnv), c.ReservedEnv...), ", ")))
		}
	}
	return nil
}
