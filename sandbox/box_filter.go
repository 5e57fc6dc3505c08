package sandbox

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kilnrun/kiln/sandbox/jobfilter"
)

// jobFilterPath is the host file holding the job seccomp filter (jobfilter),
// written once by writeJobFilter.
func (h *hostSide) jobFilterPath() string {
	return h.jobFilterFile
}

// writeJobFilter writes the job seccomp filter every box binds, through a
// temporary file of its own: runtimes sharing a state dir (two in one
// process, or a worker starting while another stops) may write it at once,
// and each replaces it whole with the same bytes.
func (h *hostSide) writeJobFilter() error {
	prog, err := jobfilter.Build()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(h.cfg.StateDir, 0o711); err != nil {
		return fmt.Errorf("sandbox: job filter: %w", err)
	}
	dst := h.jobFilterPath()
	f, err := os.CreateTemp(filepath.Dir(dst), filepath.Base(dst)+".*.tmp")
	if err != nil {
		return fmt.Errorf("sandbox: job filter: %w", err)
	}
	_, err = f.Write(prog)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), dst)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("sandbox: job filter: %w", err)
	}
	return nil
}
