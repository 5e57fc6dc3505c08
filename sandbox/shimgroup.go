package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
)

// shimGroupAnnotation makes containerd's runc-v2 shim serve every container
// whose spec carries the same value from one shim process, instead of
// starting a shim per container and running the shim binary again to clean
// up after it.
const shimGroupAnnotation = "io.containerd.runc.v2.group"

// shimGroupIdle seals a group nobody joined for this long, so the deletions
// parked on it go ahead when the worker is quiet.
const shimGroupIdle = time.Second

// A shim exits once its last container is deleted, so a container joining a
// group while its last member is deleted would reach a shim that is going
// away. shimGroups rules that out: sandboxes join the current group until it
// holds its size, or nobody joined for shimGroupIdle; then it is sealed and
// nobody joins it again. Its members are deleted only once it is sealed and
// every member has finished joining (its task created in the shim), so the
// shim never empties while a container is on its way in.
type shimGroups struct {
	size   int
	prefix string

	mu      sync.Mutex
	seq     int64
	current *shimGroup
	idle    *time.Timer
}

type shimGroup struct {
	id      string
	joined  int  // members so far (seals at size)
	joining int  // members between choosing the group and their task's creation
	sealed  bool // nobody joins any more
	ready   chan struct{}
}

func newShimGroups(size int, prefix string) *shimGroups {
	return &shimGroups{size: size, prefix: prefix}
}

// join returns the group a new sandbox joins; nil when grouping is off.
// Call joined once the sandbox's task is created (or its creation failed).
func (s *shimGroups) join() *shimGroup {
	if s == nil || s.size <= 1 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.current
	if g == nil {
		s.seq++
		g = &shimGroup{id: fmt.Sprintf("kiln-%s-%d", s.prefix, s.seq), ready: make(chan struct{})}
		s.current = g
	}
	g.joined++
	g.joining++
	if g.joined >= s.size {
		s.sealLocked(g)
	}
	if s.idle == nil {
		s.idle = time.AfterFunc(shimGroupIdle, s.sealIdle)
	} else {
		s.idle.Reset(shimGroupIdle)
	}
	return g
}

// joined records that g's member finished joining.
func (s *shimGroups) joined(g *shimGroup) {
	if g == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g.joining--
	s.readyLocked(g)
}

func (s *shimGroups) sealLocked(g *shimGroup) {
	g.sealed = true
	if s.current == g {
		s.current = nil
	}
	s.readyLocked(g)
}

func (s *shimGroups) readyLocked(g *shimGroup) {
	if g.sealed && g.joining == 0 {
		select {
		case <-g.ready:
		default:
			close(g.ready)
		}
	}
}

func (s *shimGroups) sealIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.current; g != nil {
		s.sealLocked(g)
	}
}

// sealAll seals the current group (Close: nobody joins any more).
func (s *shimGroups) sealAll() {
	if s != nil {
		s.sealIdle()
	}
}

// awaitDeletable waits until g's members may be deleted, or ctx ends.
func (s *shimGroups) awaitDeletable(ctx context.Context, g *shimGroup) {
	if g == nil {
		return
	}
	select {
	case <-g.ready:
	case <-ctx.Done():
	}
}

// withShimGroup puts the sandbox in shim group g (shimGroups); nil: a shim
// of its own.
func withShimGroup(g *shimGroup) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if g == nil {
			return nil
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[shimGroupAnnotation] = g.id
		return nil
	}
}
