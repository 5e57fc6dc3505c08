package containerd

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
)

// ShimGroupAnnotation makes containerd's runc-v2 shim serve every container
// whose spec carries the same value from one shim process, instead of
// starting a shim per container and running the shim binary again to clean
// up after it.
const ShimGroupAnnotation = "io.containerd.runc.v2.group"

// shimGroupIdle seals a group nobody joined for this long, so the deletions
// parked on it go ahead when the worker is quiet.
const shimGroupIdle = time.Second

// A shim exits once its last container is deleted, so a container joining a
// group while its last member is deleted would reach a shim that is going
// away. ShimGroups rules that out: sandboxes join the current group until it
// holds its size, or nobody joined for shimGroupIdle; then it is sealed and
// nobody joins it again. Its members are deleted only once it is sealed and
// every member has finished joining (its task created in the shim), so the
// shim never empties while a container is on its way in.
type ShimGroups struct {
	size   int
	prefix string

	mu      sync.Mutex
	seq     int64
	current *ShimGroup
	idle    *time.Timer
}

type ShimGroup struct {
	id      string
	joined  int  // members so far (seals at size)
	joining int  // members between choosing the group and their task's creation
	sealed  bool // nobody joins any more
	ready   chan struct{}
}

func NewShimGroups(size int, prefix string) *ShimGroups {
	return &ShimGroups{size: size, prefix: prefix}
}

// Join returns the group a new sandbox joins; nil when grouping is off.
// Call Joined once the sandbox's task is created (or its creation failed).
func (s *ShimGroups) Join() *ShimGroup {
	if s == nil || s.size <= 1 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.current
	if g == nil {
		s.seq++
		g = &ShimGroup{id: fmt.Sprintf("kiln-%s-%d", s.prefix, s.seq), ready: make(chan struct{})}
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

// Joined records that g's member finished joining.
func (s *ShimGroups) Joined(g *ShimGroup) {
	if g == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g.joining--
	s.readyLocked(g)
}

func (s *ShimGroups) sealLocked(g *ShimGroup) {
	g.sealed = true
	if s.current == g {
		s.current = nil
	}
	s.readyLocked(g)
}

func (s *ShimGroups) readyLocked(g *ShimGroup) {
	if g.sealed && g.joining == 0 {
		select {
		case <-g.ready:
		default:
			close(g.ready)
		}
	}
}

func (s *ShimGroups) sealIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.current; g != nil {
		s.sealLocked(g)
	}
}

// SealAll seals the current group (Close: nobody joins any more).
func (s *ShimGroups) SealAll() {
	if s != nil {
		s.sealIdle()
	}
}

// AwaitDeletable waits until g's members may be deleted, or ctx ends.
func (s *ShimGroups) AwaitDeletable(ctx context.Context, g *ShimGroup) {
	if g == nil {
		return
	}
	select {
	case <-g.ready:
	case <-ctx.Done():
	}
}

// WithShimGroup puts the sandbox in shim group g (ShimGroups); nil: a shim
// of its own.
func WithShimGroup(g *ShimGroup) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if g == nil {
			return nil
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[ShimGroupAnnotation] = g.id
		return nil
	}
}
