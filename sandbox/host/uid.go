package host

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// UIDPool hands each live sandbox a host uid (and the same gid) of its own
// from a configured range, so the kernel's per-user limits (inotify
// instances, pipe buffer pages, POSIX mqueue bytes, RLIMIT_NPROC, keyrings)
// are per job: one job exhausting them cannot starve another.
//
// Workers on one host share the range safely: a uid is held through an
// exclusive flock on dir/<uid>.lock, which the kernel also drops if the
// worker dies. A uid is released only after its sandbox's task is deleted,
// that is after every process of it is gone.
type UIDPool struct {
	start, size int
	dir         string

	mu   sync.Mutex
	held map[int]*os.File
}

// ErrNoUID is returned when every uid of the range is held.
var ErrNoUID = errors.New("every sandbox uid of the configured range is in use")

func NewUIDPool(start, size int, dir string) *UIDPool {
	return &UIDPool{start: start, size: size, dir: dir, held: map[int]*os.File{}}
}

// Acquire returns a uid no other live sandbox on the host holds.
func (p *UIDPool) Acquire() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return 0, fmt.Errorf("sandbox uids: %w", err)
	}
	// From a random place: the uid a sandbox gets says nothing of how many
	// came before it (another tenant's activity).
	start := rand.IntN(p.size)
	for i := range p.size {
		off := (start + i) % p.size
		uid := p.start + off
		if p.held[uid] != nil {
			continue
		}
		f, err := os.OpenFile(filepath.Join(p.dir, strconv.Itoa(uid)+".lock"), os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return 0, fmt.Errorf("sandbox uids: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				continue // another worker's sandbox has it
			}
			return 0, fmt.Errorf("sandbox uids: lock uid %d: %w", uid, err)
		}
		p.held[uid] = f
		return uid, nil
	}
	return 0, fmt.Errorf("sandbox uids %d-%d: %w", p.start, p.start+p.size-1, ErrNoUID)
}

// Release gives uid back; call it only once every process of the sandbox
// that held it is gone.
func (p *UIDPool) Release(uid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.held[uid]; f != nil {
		f.Close() // closing the only descriptor drops the flock
		delete(p.held, uid)
	}
}
