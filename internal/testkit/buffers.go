package testkit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"sync"

	"github.com/kilnrun/kiln/job"
)

// SyncBuffer is a log's destination shared by goroutines: what they write,
// read back whole with String.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// MemStore is an artifact store in memory (sandboxapi.Request.Store's
// shape) that checks each object it is given against its ref.
type MemStore struct {
	mu   sync.Mutex
	objs map[string][]byte
}

// Put stores r's bytes under ref, refusing them unless their SHA-256 and
// size are ref's.
func (m *MemStore) Put(_ context.Context, ref job.ObjectRef, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != ref.SHA256 || int64(len(b)) != ref.Size {
		return fmt.Errorf("store got %d bytes not matching %+v", len(b), ref)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.objs == nil {
		m.objs = map[string][]byte{}
	}
	m.objs[ref.SHA256] = b
	return nil
}

// Get is the object stored under a SHA-256 (nil: none).
func (m *MemStore) Get(sha string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.objs[sha]
}

// Objects is a copy of every object stored, by SHA-256.
func (m *MemStore) Objects() map[string][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.objs)
}
