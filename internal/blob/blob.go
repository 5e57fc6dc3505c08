package blob

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// Defaults of Config.
const (
	BucketDefault   = "KILN_BLOBS"
	TTLDefault      = 48 * time.Hour // job record TTL + result-cache TTL (24h each by default)
	MaxBytesDefault = 10 << 30
)

// Config sizes the bucket. Zero fields take the default beside them.
type Config struct {
	// Bucket names the object store. Default: BucketDefault ("KILN_BLOBS").
	Bucket string
	// TTL is how long an object lives after its last Put. Keep it at least
	// the job record TTL plus the result-cache TTL: a cached Result names
	// objects put when the job that produced it ran. Default: 48h.
	TTL time.Duration
	// Replicas of the bucket's stream. Default: 1.
	Replicas int
	// MaxBytes bounds the bucket; a Put beyond it fails. Default: 10 GiB.
	MaxBytes int64
}

func (c Config) withDefaults() Config {
	c.Bucket = cmp.Or(c.Bucket, BucketDefault)
	c.TTL = cmp.Or(c.TTL, TTLDefault)
	c.Replicas = cmp.Or(c.Replicas, 1)
	c.MaxBytes = cmp.Or(c.MaxBytes, MaxBytesDefault)
	return c
}

// Store is the content-addressed bucket. It binds to the bucket on first
// use (or Setup), so a process may start before NATS answers.
type Store struct {
	cfg Config
	js  jetstream.JetStream

	mu  sync.Mutex
	obs jetstream.ObjectStore
}

// New returns the store of cfg's bucket without contacting NATS; the bucket
// is created or updated by Setup, or by the first operation that needs it.
func New(js jetstream.JetStream, cfg Config) *Store {
	return &Store{cfg: cfg.withDefaults(), js: js}
}

// Ensure creates the bucket, or updates it to cfg, and returns it.
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	s := New(js, cfg)
	if _, err := s.bucket(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Setup creates or updates the bucket now (readiness, start-up).
func (s *Store) Setup(ctx context.Context) error {
	_, err := s.bucket(ctx)
	return err
}

// bucket returns the bound bucket, creating or updating it on first use.
func (s *Store) bucket(ctx context.Context) (jetstream.ObjectStore, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obs != nil {
		return s.obs, nil
	}
	cfg := s.cfg
	obs, err := s.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      cfg.Bucket,
		Description: "Kiln artifacts and large job inputs, content-addressed per tenant",
		TTL:         cfg.TTL,
		MaxBytes:    cfg.MaxBytes,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("blob: ensure object store %s: %w", cfg.Bucket, err)
	}
	s.obs = obs
	return obs, nil
}

// ErrNotFound is returned when an object is not (or no longer) stored.
var ErrNotFound = errors.New("blob: object not found")

// ErrFull is wrapped by a Put the bucket refused for want of room (its
// MaxBytes): a fault of the store's sizing, not one a retry soon fixes.
var ErrFull = errors.New("blob: the object store is full")

// JetStream's error codes for a message it has no room for; nats.go names
// no constants for them.
const (
	// jsErrStoreFailed: the stream could not store the message
	// ("maximum bytes exceeded" past MaxBytes with DiscardNew).
	jsErrStoreFailed jetstream.ErrorCode = 10077
	// jsErrInsufficientResources, jsErrStorageResourcesExceeded: the
	// server's own store limit (max_file_store) is reached.
	jsErrInsufficientResources    jetstream.ErrorCode = 10023
	jsErrStorageResourcesExceeded jetstream.ErrorCode = 10047
)

// isFull reports JetStream's refusal of a message past the stream's bounds
// or the server's store limit.
func isFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jsErrStoreFailed:
		return strings.Contains(apiErr.Description, "maximum")
	case jsErrInsufficientResources, jsErrStorageResourcesExceeded:
		return true
	}
	return false
}

// probeSubject is where ProbeWrite writes, in the bucket's stream's chunk
// subjects but named by no object; a rollup keeps one message of it.
func (s *Store) probeSubject() string { return "$O." + s.cfg.Bucket + ".C.kiln-write-probe" }

// ProbeWrite writes one small message into the bucket's stream and waits
// for the stream to store it. A stream whose file store hit a write error
// (a full disk) refuses every write after it, big or small, until the
// NATS server is restarted: JetStream latches the error and answers
// nothing, so this fails with a timeout while other streams still answer.
func (s *Store) ProbeWrite(ctx context.Context) error {
	if _, err := s.bucket(ctx); err != nil {
		return err
	}
	m := nats.NewMsg(s.probeSubject())
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Data = []byte{1}
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("blob: write to object store %s: %w", s.cfg.Bucket, err)
	}
	return nil
}

// Bucket is the bucket's name (its stream is OBJ_<name>).
func (s *Store) Bucket() string { return s.cfg.Bucket }

// Has reports whether ref's object is stored and young enough that it
// outlives anything pointing at it from now on (at most half its TTL old).
func (s *Store) Has(ctx context.Context, ref job.ObjectRef) (bool, error) {
	obs, err := s.bucket(ctx)
	if err != nil {
		return false, err
	}
	info, err := obs.GetInfo(ctx, ref.Name())
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("blob: stat %s: %w", ref.Name(), err)
	}
	return info.Size == uint64(ref.Size) && time.Since(info.ModTime) < s.cfg.TTL/2, nil
}

// Put stores r (whose SHA-256 and size the caller computed: ref) unless an
// object with that name is already there and young (Has); a re-put of an
// older one renews its life.
func (s *Store) Put(ctx context.Context, ref job.ObjectRef, r io.Reader) error {
	if ok, err := s.Has(ctx, ref); err != nil || ok {
		return err
	}
	obs, err := s.bucket(ctx)
	if err != nil {
		return err
	}
	info, err := obs.Put(ctx, jetstream.ObjectMeta{Name: ref.Name()}, r)
	if isFull(err) {
		return fmt.Errorf("blob: put %s: %w (%d bytes): %w", ref.Name(), ErrFull, s.cfg.MaxBytes, err)
	}
	if err != nil {
		return fmt.Errorf("blob: put %s: %w", ref.Name(), err)
	}
	if info.Size != uint64(ref.Size) {
		return fmt.Errorf("blob: put %s: stored %d bytes, expected %d", ref.Name(), info.Size, ref.Size)
	}
	return nil
}

// Object is an open stored object; read it to its end and close it.
type Object interface {
	io.ReadCloser
}

// Open streams ref's object. The object store checks the content's digest as
// the last chunk is read, so a reader that reads to EOF without an error got
// the stored bytes.
func (s *Store) Open(ctx context.Context, ref job.ObjectRef) (Object, error) {
	obs, err := s.bucket(ctx)
	if err != nil {
		return nil, err
	}
	res, err := obs.Get(ctx, ref.Name())
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, ref.Name())
	}
	if err != nil {
		return nil, fmt.Errorf("blob: get %s: %w", ref.Name(), err)
	}
	return res, nil
}

// GetBytes reads a whole object, at most max bytes.
func (s *Store) GetBytes(ctx context.Context, ref job.ObjectRef, max int64) ([]byte, error) {
	if ref.Size > max {
		return nil, fmt.Errorf("blob: %s is %d bytes, over %d", ref.Name(), ref.Size, max)
	}
	o, err := s.Open(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	b, err := io.ReadAll(io.LimitReader(o, max+1))
	if err != nil {
		return nil, fmt.Errorf("blob: read %s: %w", ref.Name(), err)
	}
	if int64(len(b)) != ref.Size {
		return nil, fmt.Errorf("blob: %s has %d bytes, expected %d", ref.Name(), len(b), ref.Size)
	}
	return b, nil
}

// OpenSpooled reads ref's whole object into an unlinked temporary file in
// dir ("" for the system's) and returns that file, positioned at its start;
// closing it frees the space. Readers that forward an object at a client's
// pace use it, so the object store's consumer is never held open (and
// stalled) by a slow client, and no object is held in memory.
func (s *Store) OpenSpooled(ctx context.Context, ref job.ObjectRef, dir string) (io.ReadCloser, error) {
	o, err := s.Open(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	f, err := os.CreateTemp(dir, "kiln-object-*")
	if err != nil {
		return nil, fmt.Errorf("blob: spool %s: %w", ref.Name(), err)
	}
	_ = os.Remove(f.Name()) // unlinked: the space is freed on close, whatever happens
	n, err := io.Copy(f, io.LimitReader(o, ref.Size+1))
	if err == nil && n != ref.Size {
		err = fmt.Errorf("%d bytes, expected %d", n, ref.Size)
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("blob: spool %s: %w", ref.Name(), err)
	}
	return f, nil
}
