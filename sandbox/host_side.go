package sandbox

import (
	"log/slog"
	"sync"

	"github.com/kilnrun/kiln/sandbox/host"
)

// hostSide is what a sandbox takes on the host beside its containerd
// objects, and gives back: a host uid, or a box's range of them
// (box_uid.go); its work dir under the worker's state dir and the
// artifacts collected from it (workdir.go); and the job seccomp filter
// every box binds (box_filter.go). The sandbox's init files are its
// lifecycle's (lifecycle.hostFiles).
// It reaps the work dirs of containers the runtime no longer owns.
type hostSide struct {
	cfg         Config
	boxUIDStart int // BoxConfig.UIDStart
	log         *slog.Logger
	uids        *host.UIDPool // a uid per container of its own (Config.UIDStart)
	boxRanges   *host.UIDPool // indices of the boxes' uid ranges (BoxConfig.UIDStart)
	// jobFilterFile holds the job seccomp filter boxes bind (writeJobFilter).
	jobFilterFile string
	live          *liveSet // what reapWorkDirs leaves
}

// liveSet is the container ids (and box control sockets) this runtime
// owns: the sweep and the reaping of work dirs leave them.
type liveSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func newLiveSet() *liveSet { return &liveSet{ids: map[string]bool{}} }

// track records that this runtime owns id (live) or no longer does.
func (l *liveSet) track(id string, live bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if live {
		l.ids[id] = true
	} else {
		delete(l.ids, id)
	}
}

// owns reports whether id is this runtime's (track).
func (l *liveSet) owns(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ids[id]
}
