package sandbox

import (
	"fmt"
	"os"

	"github.com/kilnrun/kiln/sandbox/jobfilter"
)

// jobFilterPath is the host file holding the job seccomp filter (jobfilter),
// written once by writeJobFilter.
func (h *hostSide) jobFilterPath() string {
	return h.jobFilterFile
}

// writeJobFilter writes the job seccomp filter every box binds.
func (h *hostSide) writeJobFilter() error {
	prog, err := jobfilter.Build()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(h.cfg.StateDir, 0o711); err != nil {
		return fmt.Errorf("sandbox: job filter: %w", err)
	}
	tmp := h.jobFilterPath() + ".tmp"
	if err := os.WriteFile(tmp, prog, 0o644); err != nil {
		return fmt.Errorf("sandbox: job filter: %w", err)
	}
	if err := os.Rename(tmp, h.jobFilterPath()); err != nil {
		return fmt.Errorf("sandbox: job filter: %w", err)
	}
	return nil
}
