package runtimes

import (
	"encoding/json"
	"fmt"

	"github.com/kilnrun/kiln/job"
)

// Packages is the LabelPackages value: what an image can import, listed
// when it was built.
type Packages struct {
	// Language is the language the list is of.
	Language string `json:"language"`
	// Version is the interpreter's version.
	Version string `json:"version"`
	// Packages are the installed packages and the modules each provides.
	Packages []job.Package `json:"packages"`
}

// ParsePackages reads a LabelPackages value; an image without the label
// ("") has an empty list.
func ParsePackages(raw string) (Packages, error) {
	var pk Packages
	if raw == "" {
		return pk, nil
	}
	if err := json.Unmarshal([]byte(raw), &pk); err != nil {
		return Packages{}, fmt.Errorf("package list: %w", err)
	}
	return pk, nil
}
