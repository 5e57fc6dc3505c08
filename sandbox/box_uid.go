package sandbox

import (
	"fmt"
	"os"
)

// mapBoxUsers writes the uid and gid maps of the user namespace the
// zygote of sb (host pid) made: root inside is sb.box.base.
func mapBoxUsers(sb *sandbox, pid int32) error {
	m := fmt.Sprintf("0 %d %d\n", sb.box.base, boxUIDRange)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", pid, f), []byte(m), 0); err != nil {
			return fmt.Errorf("sandbox: box %s: write %s: %w", sb.id, f, err)
		}
	}
	return nil
}

// sandboxUID takes the host uid a sandbox runs as: one of its own for a
// container per job (host.UIDPool), or the base of a range of boxUIDRange uids
// for a box, drawn at random among the free ranges.
func (r *Containerd) sandboxUID(sb *sandbox, box bool) (int, error) {
	if !box {
		uid, err := r.uids.Acquire()
		sb.uid = uid
		return uid, err
	}
	idx, err := r.boxRanges.Acquire()
	if err != nil {
		return 0, fmt.Errorf("sandbox: box uid range: %w", err)
	}
	sb.box.uidRange = idx + 1
	sb.box.base = r.boxCfg.UIDStart + idx*boxUIDRange
	sb.uid = sb.box.base
	return sb.uid, nil
}
