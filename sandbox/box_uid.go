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
func (h *hostSide) sandboxUID(sb *sandbox, box bool) (int, error) {
	if !box {
		uid, err := h.uids.Acquire()
		sb.uid = uid
		return uid, err
	}
	idx, err := h.boxRanges.Acquire()
	if err != nil {
		return 0, fmt.Errorf("sandbox: box uid range: %w", err)
	}
	sb.box.uidRange = idx + 1
	sb.box.base = h.boxUIDStart + idx*boxUIDRange
	sb.uid = sb.box.base
	return sb.uid, nil
}

// supervisorUID is the host uid kiln-init runs as in a sandbox whose job
// runs as uid: in a container of its own, uid + UIDCount, a uid of the
// sandbox's alone that no job ever has, so no process-directed call of the
// job (a signal, prlimit, ptrace, scheduling) reaches it, whatever pid or
// thread it aims at; in a box, uid itself (the box's root: its
// supervisors are out of every job's pid namespace and user namespace).
func (h *hostSide) supervisorUID(uid int, box bool) int {
	if box {
		return uid
	}
	return uid + h.cfg.UIDCount
}
