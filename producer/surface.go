package producer

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/job"
)

// Other surfaces of the API (e2bapi: E2B's wire format) are mounted on the
// Server's own address and call the domain through the methods below: the
// same calls the native handlers make, so tenants, quotas, budgets,
// redaction, audit and tracing hold there as they do on /v1. A refusal is
// an error carrying the problem the native API would answer (ProblemOf).

// Surface is a set of routes another wire format serves on the API's
// address; Match picks its requests before the native routes see them.
type Surface interface {
	http.Handler
	Match(r *http.Request) bool
}

// Domain is a Server's session calls as other wire formats make them
// (DomainOf). Its methods hold nothing of their own: each is the call a
// native handler makes.
type Domain struct{ s *Server }

// DomainOf is s's Domain.
func DomainOf(s *Server) *Domain { return &Domain{s: s} }

// Mount adds surface to the Server's handler. Call it before serving.
func (d *Domain) Mount(surface Surface) {
	s := d.s
	for {
		old := s.surfaces.Load()
		next := []Surface{surface}
		if old != nil {
			next = append(append([]Surface(nil), *old...), surface)
		}
		if s.surfaces.CompareAndSwap(old, &next) {
			return
		}
	}
}

// withSurfaces serves a request a surface mounted on s matches there,
// else by next (the native routes).
func withSurfaces(s *Server, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ss := s.surfaces.Load(); ss != nil {
			for _, sf := range *ss {
				if sf.Match(r) {
					sf.ServeHTTP(w, r)
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

type surfaces = atomic.Pointer[[]Surface]

// ProblemOf reads the problem a domain call's error carries: its HTTP
// status, title and detail, whether retrying may help, and when. ok is
// false for an error that carries none.
func ProblemOf(err error) (status int, title, detail string, retryAfter time.Duration, ok bool) {
	var p *problem
	if !errors.As(err, &p) {
		return 0, "", "", 0, false
	}
	return p.Status, p.Title, p.Detail, p.retryAfter, true
}

func errOf(p *problem) error {
	if p == nil {
		return nil
	}
	return p
}

type callerKeyCtx struct{}

// Authenticate checks key as the Authorization header's bearer key is
// checked and returns its tenant, with ctx carrying what audit records and
// SessionToken need of the key. With no keys configured (dev mode) every
// key is the one tenant's.
func (d *Domain) Authenticate(ctx context.Context, key string) (context.Context, string, error) {
	s := d.s
	if len(s.keys) == 0 {
		return context.WithValue(ctx, callerKeyCtx{}, [sha256.Size]byte{}), job.DefaultTenant, nil
	}
	r, _ := http.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	tenant, auditID, p := s.keys.authenticate(r)
	if p != nil {
		return ctx, "", p
	}
	return context.WithValue(context.WithValue(ctx, auditKeyCtx{}, auditID), callerKeyCtx{}, sha256.Sum256([]byte(key))), tenant, nil
}

// SessionToken is a capability for session id, made from the key ctx was
// authenticated with (Authenticate): AuthenticateSession takes it as long
// as that key is configured. It lets a surface whose data-plane requests
// carry a token rather than the API key (E2B's envd and code interpreter)
// authenticate them without storing anything.
func (d *Domain) SessionToken(ctx context.Context, id string) string {
	sum, _ := ctx.Value(callerKeyCtx{}).([sha256.Size]byte)
	return sessionToken(sum, id)
}

func sessionToken(keySum [sha256.Size]byte, id string) string {
	m := hmac.New(sha256.New, keySum[:])
	m.Write([]byte("kiln session token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// AuthenticateSession checks token (SessionToken) for session id and
// returns its tenant, with ctx carrying the key's audit id. A session that
// does not exist, or a token that no configured key of its tenant made,
// is not found: the same answer as another tenant's session.
func (d *Domain) AuthenticateSession(ctx context.Context, id, token string) (context.Context, string, error) {
	s := d.s
	st, p := s.sessions.sessionStore()
	if p != nil {
		return ctx, "", p
	}
	if !job.ValidID(id) {
		return ctx, "", sessionNotFound(id)
	}
	rec, err := st.Session(ctx, id)
	if errors.Is(err, cache.ErrNotFound) {
		return ctx, "", sessionNotFound(id)
	}
	if err != nil {
		return ctx, "", s.problems.storeProblem(ctx, "read session", err)
	}
	if len(s.keys) == 0 {
		if subtle.ConstantTimeCompare([]byte(token), []byte(sessionToken([sha256.Size]byte{}, id))) == 1 {
			return context.WithValue(ctx, callerKeyCtx{}, [sha256.Size]byte{}), rec.Tenant, nil
		}
		return ctx, "", sessionNotFound(id)
	}
	for i := range s.keys {
		k := &s.keys[i]
		if k.name == rec.Tenant && subtle.ConstantTimeCompare([]byte(token), []byte(sessionToken(k.sum, id))) == 1 {
			return context.WithValue(context.WithValue(ctx, auditKeyCtx{}, k.auditID), callerKeyCtx{}, k.sum), rec.Tenant, nil
		}
	}
	return ctx, "", sessionNotFound(id)
}

// CreateSession is POST /v1/sessions.
func (d *Domain) CreateSession(ctx context.Context, tenant string, spec job.SessionSpec) (job.Session, error) {
	s := d.s
	st, p := s.sessions.sessionStore()
	if p != nil {
		return job.Session{}, p
	}
	rec, p := s.sessions.createSession(ctx, st, tenant, spec)
	if p != nil {
		return job.Session{}, p
	}
	return rec.View(s.cfg.Now()), nil
}

// GetSession is GET /v1/sessions/{id}, with the files of the session's
// /work as its last call left them.
func (d *Domain) GetSession(ctx context.Context, tenant, id string) (job.Session, []job.SessionFileEntry, error) {
	s := d.s
	st, p := s.sessions.sessionStore()
	if p != nil {
		return job.Session{}, nil, p
	}
	rec, p := s.sessions.sessionOf(ctx, st, tenant, id)
	if p != nil {
		return job.Session{}, nil, p
	}
	return rec.View(s.cfg.Now()), rec.Files, nil
}

// ListSessions is GET /v1/sessions.
func (d *Domain) ListSessions(ctx context.Context, tenant string, tags job.Metadata) ([]job.Session, error) {
	out, p := d.s.sessions.listSessions(ctx, tenant, tags)
	return out, errOf(p)
}

// DeleteSession is DELETE /v1/sessions/{id}.
func (d *Domain) DeleteSession(ctx context.Context, tenant, id string) (job.Session, error) {
	v, p := d.s.sessions.deleteSession(ctx, tenant, id)
	return v, errOf(p)
}

// PauseSession is POST /v1/sessions/{id}/pause: paused is false when wait
// passed first (it pauses once the calls before it end).
func (d *Domain) PauseSession(ctx context.Context, tenant, id string, wait time.Duration) (v job.Session, paused bool, err error) {
	s := d.s
	st, p := s.sessions.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = s.sessions.sessionOf(ctx, st, tenant, id)
	}
	if p == nil {
		rec, paused, p = s.sessions.pauseSession(ctx, st, rec, wait)
	}
	if p != nil {
		return job.Session{}, false, p
	}
	return rec.View(s.cfg.Now()), paused, nil
}

// ResumeSession is POST /v1/sessions/{id}/resume.
func (d *Domain) ResumeSession(ctx context.Context, tenant, id string) (job.Session, error) {
	v, p := d.s.sessions.resumeSession(ctx, tenant, id)
	return v, errOf(p)
}

// RunCall is POST /v1/sessions/{id}/exec: the call's result once it has
// ended, or where it stands (pending) when wait passes first.
func (d *Domain) RunCall(ctx context.Context, tenant, id string, call job.SessionCall, wait time.Duration) (*job.CallResult, *job.CallPending, error) {
	s := d.s
	ans, p := s.sessions.runSessionCall(ctx, tenant, id, call, "", wait)
	if p != nil {
		return nil, nil, p
	}
	if ans.pending != nil {
		return nil, ans.pending, nil
	}
	return &ans.res, nil, nil
}

// MaxWait is the longest a call waits for its result (Config.MaxWait).
func (d *Domain) MaxWait() time.Duration { return d.s.cfg.MaxWait }

// OpenSessionFile is GET /v1/sessions/{id}/files/{name}: the file's bytes
// as the last call left it (the checkpoint), and its size.
func (d *Domain) OpenSessionFile(ctx context.Context, tenant, id, name string) (io.ReadCloser, int64, error) {
	s := d.s
	st, p := s.sessions.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = s.sessions.sessionOf(ctx, st, tenant, id)
	}
	if p != nil {
		return nil, 0, p
	}
	if err := job.ValidSessionFilePath(name); err != nil {
		return nil, 0, s.problems.toProblem(ctx, "session file", err)
	}
	f, ok := checkpointEntry(rec, name)
	if !ok {
		return nil, 0, s.problems.toProblem(ctx, "session file", fileNotFound(rec, name))
	}
	o, err := s.blobs.Open(ctx, job.ObjectRef{Tenant: rec.Tenant, SHA256: f.SHA256, Size: f.Size})
	if err != nil {
		return nil, 0, s.problems.storeProblem(ctx, "session file", err)
	}
	return o, f.Size, nil
}

// FollowCall is GET /v1/sessions/{id}/calls/{seq}/events for a surface of
// its own: fn gets each event call seq publishes (stdout, stderr, display,
// status: job.Event*), in order, as it comes, from the call's first;
// FollowCall returns the call's result once the call has ended. The reading
// holds one of the tenant's event streams; while it waits, the session is
// brought back should its worker be gone, as for AwaitCall. A call that
// cannot be followed (the tenant's streams at their bound, the events
// stream unavailable) is waited for instead: fn hears nothing and the
// result has all of it. The call was accepted, so it is never refused here.
// It returns nil and no error when ctx ends first, the API shuts down or fn
// returns an error.
func (d *Domain) FollowCall(ctx context.Context, tenant, id string, seq int64, fn func(typ string, data []byte) error) (*job.CallResult, error) {
	s := d.s
	st, rec, c, p := s.sessions.sessionCall(ctx, tenant, id, seq, "")
	if p != nil {
		return nil, p
	}
	if !job.ValidID(c.Spec.EventsID) {
		// A call accepted before calls had events: its result only.
		return d.awaitEnd(ctx, tenant, id, seq)
	}
	var res *job.CallResult
	p = s.events.followRun(ctx, tenant, c.Spec.EventsID, 0, c.Result != nil, s.sessions.callEnded(st, rec.ID, seq, &c), nil, eventReader{
		event: func(_ uint64, typ string, data []byte) error { return fn(typ, data) },
		result: func(context.Context) {
			if c.Result != nil {
				r := *c.Result
				res = &r
			}
		},
	})
	if p != nil {
		s.log.DebugContext(ctx, "follow a session call: its result is waited for instead", slog.String("session_id", rec.ID),
			slog.Int64("seq", seq), slog.String("problem", p.Detail))
		return d.awaitEnd(ctx, tenant, id, seq)
	}
	if res == nil {
		// The reading stopped before the call's end (its consumer
		// failed): the rest is waited for, unless ctx or the API ended.
		return d.awaitEnd(ctx, tenant, id, seq)
	}
	return res, nil
}

// InterruptCall interrupts call seq of session id: one still queued is
// withdrawn (it never runs; it is answered canceled when its turn comes),
// one running is interrupted as its timeout would interrupt it (it ends
// canceled, the session's interpreter and its state are kept). A call that
// has ended is left as it is. Either is in the tenant's audit log (kind
// cancel).
func (d *Domain) InterruptCall(ctx context.Context, tenant, id string, seq int64) error {
	if p := d.s.sessions.interruptCall(ctx, tenant, id, seq, ""); p != nil {
		return p
	}
	return nil
}

// awaitEnd waits for call seq's result as long as ctx lasts; nil and no
// error when ctx ends first or the API shuts down.
func (d *Domain) awaitEnd(ctx context.Context, tenant, id string, seq int64) (*job.CallResult, error) {
	for ctx.Err() == nil && d.s.waits.done.Err() == nil {
		res, pending, err := d.AwaitCall(ctx, tenant, id, seq, d.MaxWait())
		if err != nil || pending == nil {
			return res, err
		}
	}
	return nil, nil
}

// AwaitCall is GET /v1/sessions/{id}/calls/{seq}?wait=: call seq's result
// once it has ended, or where it stands when wait passes first.
func (d *Domain) AwaitCall(ctx context.Context, tenant, id string, seq int64, wait time.Duration) (*job.CallResult, *job.CallPending, error) {
	s := d.s
	st, p := s.sessions.sessionStore()
	var rec cache.SessionRecord
	if p == nil {
		rec, p = s.sessions.sessionOf(ctx, st, tenant, id)
	}
	if p != nil {
		return nil, nil, p
	}
	done := make(chan *nats.Msg, 64)
	sub, err := s.nc.ChanSubscribe(job.SessionDonePrefix+rec.ID, done)
	if err != nil {
		return nil, nil, s.problems.storeProblem(ctx, "read call", err)
	}
	defer sub.Unsubscribe()
	ans, p := s.sessions.awaitCall(ctx, st, rec.ID, seq, wait, done)
	if p != nil {
		return nil, nil, p
	}
	if ans.pending != nil {
		return nil, ans.pending, nil
	}
	return &ans.res, nil, nil
}
