package callback

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/internal/resultio"
	"github.com/kilnrun/kiln/job"
)

// Defaults applied to zero Config fields.
const (
	TimeoutDefault      = 10 * time.Second
	RetryInitialDefault = time.Second
	RetryMaxDefault     = 5 * time.Minute
	MaxAgeDefault       = time.Hour
	ConcurrencyDefault  = 16
)

// Store is what the deliverer reads and writes of a job record; *cache.Store.
type Store interface {
	GetJob(ctx context.Context, id string) (cache.Record, error)
	SetCallback(ctx context.Context, id string, st job.CallbackState) error
}

// Config configures a Deliverer. Zero fields take the default named beside them.
type Config struct {
	// NATS carries the KILN_CALLBACKS stream. Required.
	NATS *nats.Conn
	// Store holds the job records: the Result to send, the state to update. Required.
	Store Store
	// Queue sizes the callback stream like the job stream (replicas, bounds).
	Queue queue.Config
	// Guard says which addresses may be called. Required.
	Guard *Guard
	// Secrets gives each tenant's signing secret. Required.
	Secrets Secrets
	// Timeout bounds one attempt (connect, send, answer). Default 10s; at most
	// half of queue.CallbackAckWait.
	Timeout time.Duration
	// RetryInitial is the back-off after the first failed attempt; it doubles
	// with each attempt up to RetryMax. Defaults 1s and 5m.
	RetryInitial time.Duration
	RetryMax     time.Duration
	// MaxAge is how long after the job ended a callback is still tried; after
	// it the callback is recorded as failed. Default 1h.
	MaxAge time.Duration
	// Concurrency is the number of callbacks in flight at once. Default 16.
	Concurrency int
	// TenantConcurrency gives the number of a tenant's callbacks in flight
	// at once (its key-file setting); a tenant's callbacks beyond it wait
	// (are handed back to the stream for a while), so a receiver that hangs
	// delays only its own tenant. Nil, or 0 for a tenant:
	// TenantConcurrencyDefault (4).
	TenantConcurrency func(tenant string) int
	// DestinationConcurrency is the number of callbacks in flight at once
	// to one destination (scheme, host and port), whatever their tenants:
	// a receiver that hangs holds no more, so the same tenant's callbacks
	// to other receivers, and other tenants', go out meanwhile. Default
	// DestinationConcurrencyDefault (2).
	DestinationConcurrency int
	// Logger receives the deliverer's log lines. Default: discard.
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Blob names the object store holding job output too long to keep
	// inline; it must match the workers'. Zero fields take blob's defaults.
	Blob blob.Config
}

func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, TimeoutDefault)
	c.RetryInitial = cmp.Or(c.RetryInitial, RetryInitialDefault)
	c.RetryMax = cmp.Or(c.RetryMax, RetryMaxDefault)
	c.MaxAge = cmp.Or(c.MaxAge, MaxAgeDefault)
	c.Concurrency = cmp.Or(c.Concurrency, ConcurrencyDefault)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	switch {
	case c.NATS == nil:
		return errors.New("callback config: NATS is required")
	case c.Store == nil:
		return errors.New("callback config: Store is required")
	case c.Guard == nil:
		return errors.New("callback config: Guard is required")
	case c.Secrets == nil:
		return errors.New("callback config: Secrets is required")
	case c.Timeout < 0, c.RetryInitial < 0, c.RetryMax < 0, c.MaxAge < 0, c.Concurrency < 0, c.DestinationConcurrency < 0:
		return errors.New("callback config: durations and Concurrency must not be negative (0 takes the default)")
	}
	if c.withDefaults().Timeout > queue.CallbackAckWait/2 {
		return fmt.Errorf("callback config: Timeout %v exceeds %v (half the stream's ack wait)", c.Timeout, queue.CallbackAckWait/2)
	}
	return nil
}

// Deliverer consumes KILN_CALLBACKS and delivers each callback.
type Deliverer struct {
	blobs  *blob.Store // job output kept in the object store
	cfg    Config
	log    *slog.Logger
	js     jetstream.JetStream
	client *http.Client
	slots  slots // each tenant's callbacks being sent, by tenant token
	dests  slots // each destination's callbacks being sent

	stream  jetstream.Stream // KILN_CALLBACKS, once Run opened it
	wake    chan wake        // slots that freed: a tenant's, or a destination's for a tenant
	parked  parkedSet        // the tenants and destinations this deliverer parked callbacks of
	names   seenNames        // tenant token → tenant, while its callbacks are parked or sent
	dnames  seenNames        // destination key → destination, likewise
	waiters waiters          // the tenants with callbacks parked for each destination
}

// New checks cfg and returns a Deliverer; Run starts it.
func New(cfg Config) (*Deliverer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("callback: jetstream: %w", err)
	}
	dialer := &net.Dialer{Timeout: cfg.Timeout, Control: cfg.Guard.control}
	return &Deliverer{
		blobs: blob.New(js, cfg.Blob),
		cfg:   cfg,
		log:   cfg.Logger,
		js:    js,
		wake:  make(chan wake, 256),
		client: &http.Client{
			Timeout: cfg.Timeout,
			Transport: &http.Transport{
				Proxy:                 nil, // a proxy would dial for us, past the Guard
				DialContext:           dialer.DialContext,
				TLSHandshakeTimeout:   cfg.Timeout,
				ResponseHeaderTimeout: cfg.Timeout,
				MaxIdleConnsPerHost:   4,
				IdleConnTimeout:       30 * time.Second,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

// Run delivers callbacks until ctx ends. Callbacks being sent when it ends
// are handed back to the stream, not counted as attempts.
//
// Two consumers serve every tenant: the tenants' callback subjects
// (job.TenantCallbackSubject), and the job-id subjects callbacks were
// published on before tenants had subjects. A callback whose tenant or
// destination has every slot busy is parked on the parked subject of its
// tenant and destination, which no consumer reads (queue.ParkCallback);
// Run moves parked callbacks back as slots free: one to a destination
// with a slot free when an attempt of its tenant ends, one to the
// destination when an attempt to it ends, and every parkedEvery as many
// as the slots of both allow.
func (d *Deliverer) Run(ctx context.Context) error {
	stream, err := queue.EnsureCallbackStream(ctx, d.js, d.cfg.Queue)
	if err != nil {
		return fmt.Errorf("callback: %w", err)
	}
	legacy, err := queue.EnsureCallbackConsumer(ctx, d.js)
	if err != nil {
		return fmt.Errorf("callback: %w", err)
	}
	tenants, err := d.tenantsConsumer(ctx, stream)
	if err != nil {
		return err
	}
	d.stream = stream
	sem := make(chan struct{}, d.cfg.Concurrency)
	// The handlers under way, waited for as Run returns (after the
	// consumers are stopped). A consumer may still call handler after its
	// Stop: once the wait begins, such a message is handed back instead of
	// handled, so no handler starts after the wait (a WaitGroup's Add
	// racing its Wait).
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		stopped bool
	)
	defer func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		wg.Wait()
	}()
	handler := func(msg jetstream.Msg) {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			_ = msg.Nak()
			return
		}
		mu.Lock()
		if stopped {
			mu.Unlock()
			<-sem
			_ = msg.Nak()
			return
		}
		wg.Add(1)
		mu.Unlock()
		go func() {
			defer func() { <-sem; wg.Done() }()
			d.handle(ctx, msg)
		}()
	}
	for _, cons := range []jetstream.Consumer{legacy, tenants} {
		cc, err := cons.Consume(handler, jetstream.PullMaxMessages(d.cfg.Concurrency))
		if err != nil {
			return fmt.Errorf("callback: consume: %w", err)
		}
		defer cc.Stop()
	}
	tick := time.NewTicker(parkedEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case w := <-d.wake:
			d.woken(ctx, w)
		case <-tick.C:
			d.unparkAll(ctx)
		}
	}
}

// tenantsConsumer retires the consumers of one tenant each an earlier
// version made, then makes (or updates) the tenants' consumer; a deliverer
// of the earlier version still running may make one again meanwhile, so it
// tries every parkedEvery until it succeeds or ctx ends.
func (d *Deliverer) tenantsConsumer(ctx context.Context, stream jetstream.Stream) (jetstream.Consumer, error) {
	for {
		n, err := queue.RetireTenantCallbackConsumers(ctx, stream)
		if n > 0 {
			d.log.InfoContext(ctx, "callback: retired the earlier version's consumers of one tenant each", slog.Int("consumers", n))
		}
		var cons jetstream.Consumer
		if err == nil {
			if cons, err = queue.EnsureTenantCallbacksConsumer(ctx, d.js); err == nil {
				return cons, nil
			}
		}
		d.log.WarnContext(ctx, "callback: make the tenants' consumer; trying again", slog.Any("error", err))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("callback: %w", ctx.Err())
		case <-time.After(parkedEvery):
		}
	}
}

// parkedEvery is how often Run looks for tenants with parked callbacks and
// free slots: a callback parked by another deliverer, or before a restart,
// waits at most this long once its tenant's and destination's slots are
// free.
const parkedEvery = 500 * time.Millisecond

// wake says which slot freed: one of tenant token's (dest ""), or one of
// destination dest's that token's callbacks wait for.
type wake struct{ token, dest string }

// park moves msg, which waits for its tenant's or destination's slots, out
// of the consumer it came through: to the parked subject of its tenant and
// destination when it came on the tenant's subject, else (a callback of
// the earlier layout) back to its consumer for deferDelay.
func (d *Deliverer) park(ctx context.Context, msg jetstream.Msg, token, dest string, deliveries uint64, free time.Time) {
	if strings.HasPrefix(msg.Subject(), job.CallbackTenantPrefix) {
		p := queue.Parked{Token: token, Dest: destinationKey(dest)}
		d.dnames.store(p.Dest, dest)
		err := queue.ParkCallback(ctx, d.js, msg, p)
		if err == nil {
			d.parked.add(p)
			_ = msg.Ack()
			return
		}
		if ctx.Err() == nil {
			d.log.WarnContext(ctx, "callback: park a callback waiting its turn", slog.Any("error", err))
		}
	}
	_ = msg.NakWithDelay(d.deferDelay(deliveries, free))
}

// woken moves back one callback parked here that the freed slot w lets
// go: to w's destination when it names one, else to the next of w's
// tenant's destinations with a slot free, in turn (so a tenant's callbacks
// to one receiver that hangs are not ahead of its callbacks to another).
func (d *Deliverer) woken(ctx context.Context, w wake) {
	if w.dest != "" {
		p := queue.Parked{Token: w.token, Dest: destinationKey(w.dest)}
		if d.parked.has(p) {
			d.unpark(ctx, p, 1)
		}
		return
	}
	for _, dest := range d.parked.turn(w.token, func(dest string) bool { return d.destinationFree(dest) > 0 }) {
		if d.unpark(ctx, queue.Parked{Token: w.token, Dest: dest}, 1) {
			return
		}
	}
}

// destinationFree is the number of free slots of the destination with
// key; one never seen here has them all.
func (d *Deliverer) destinationFree(key string) int {
	dest, ok := d.dnames.load(key)
	if !ok {
		return d.destinationLimit()
	}
	return d.destinationLimit() - d.dests.busyOf(dest)
}

// unpark moves up to n of p's parked callbacks back to its tenant's
// subject, and reports whether it moved any.
func (d *Deliverer) unpark(ctx context.Context, p queue.Parked, n int) bool {
	for i := range n {
		moved, err := queue.UnparkCallback(ctx, d.stream, d.js, p)
		if err != nil && ctx.Err() == nil {
			d.log.WarnContext(ctx, "callback: move a parked callback back", slog.String("tenant_token", p.Token), slog.Any("error", err))
		}
		if !moved {
			if err == nil {
				d.parked.remove(p)
			}
			return i > 0
		}
	}
	return n > 0
}

// unparkAll moves back, for every tenant and destination with parked
// callbacks, as many as both have slots free.
func (d *Deliverer) unparkAll(ctx context.Context) {
	parked, err := queue.ParkedCallbacks(ctx, d.stream)
	if err != nil && ctx.Err() == nil {
		d.log.WarnContext(ctx, "callback: list tenants with parked callbacks", slog.Any("error", err))
	}
	tenantFree := map[string]int{}
	for p, count := range parked {
		free, ok := tenantFree[p.Token]
		if !ok {
			limit := TenantConcurrencyDefault
			if tenant, ok := d.names.load(p.Token); ok {
				limit = d.tenantLimit(tenant)
			}
			free = limit - d.slots.busyOf(p.Token)
		}
		n := min(free, d.destinationFree(p.Dest))
		if uint64(max(n, 0)) > count {
			n = int(count)
		}
		if n > 0 {
			d.parked.add(p)
			d.unpark(ctx, p, n)
		}
		tenantFree[p.Token] = free - max(n, 0)
	}
	if err == nil {
		d.forget(parked)
	}
}

// forget drops the names of tenants and destinations with nothing parked
// (parked lists what is) and nothing being sent.
func (d *Deliverer) forget(parked map[queue.Parked]uint64) {
	tokens, dests := map[string]bool{}, map[string]bool{}
	for p := range parked {
		tokens[p.Token], dests[p.Dest] = true, true
	}
	d.names.sweep(func(token, _ string) bool { return tokens[token] || d.slots.busyOf(token) > 0 })
	d.dnames.sweep(func(key, dest string) bool { return dests[key] || d.dests.busyOf(dest) > 0 })
}

// attempted tells Run that slot w freed (an attempt of w's tenant, or to
// the destination one of its callbacks waits for, ended), so that one of
// the callbacks parked for it is moved back.
func (d *Deliverer) attempted(w wake) {
	select {
	case d.wake <- w:
	default: // Run is busy; its sweep moves it
	}
}

// handle makes one delivery attempt and acks or naks the message.
func (d *Deliverer) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.TermWithReason("no metadata")
		return
	}
	var req job.CallbackRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil || !job.ValidID(req.ID) {
		d.log.ErrorContext(ctx, "undecodable callback request; dropping", slog.Any("error", err))
		_ = msg.TermWithReason("undecodable callback request")
		return
	}
	tenant := job.TenantOr(req.Tenant)
	token := job.TenantToken(tenant)
	d.names.store(token, tenant)
	// Both slots are taken before anything else: a callback that waits
	// holds neither while it is parked.
	dest := destination(req.URL)
	releaseDest, free, ok := d.dests.acquire(dest, d.destinationLimit(), d.cfg.Now().Add(d.cfg.Timeout))
	if !ok {
		// Not an attempt: other callbacks to this receiver hold its slots.
		d.waiters.add(dest, token)
		d.park(ctx, msg, token, dest, meta.NumDelivered, free)
		return
	}
	release, free, ok := d.slots.acquire(token, d.tenantLimit(tenant), d.cfg.Now().Add(d.cfg.Timeout))
	if !ok {
		// Not an attempt: the tenant's other callbacks hold its slots.
		releaseDest()
		d.park(ctx, msg, token, dest, meta.NumDelivered, free)
		return
	}
	defer func() {
		release()
		releaseDest()
		d.attempted(wake{token: token})
		if tok, ok := d.waiters.next(dest); ok {
			d.attempted(wake{token: tok, dest: dest})
		}
	}()
	log := d.log.With(slog.String("job_id", req.ID), slog.Uint64("delivery", meta.NumDelivered))
	rec, err := d.cfg.Store.GetJob(ctx, req.ID)
	switch {
	case errors.Is(err, cache.ErrNotFound):
		log.WarnContext(ctx, "callback: job record gone (expired or lost); nothing to send")
		_ = msg.TermWithReason("job record gone")
		return
	case err != nil:
		log.WarnContext(ctx, "callback: read job record; trying later", slog.Any("error", err))
		_ = msg.NakWithDelay(d.cfg.RetryInitial)
		return
	case rec.Callback != nil && rec.Callback.State != job.CallbackPending:
		_ = msg.Ack() // a duplicate of a callback already settled
		return
	case !rec.Status.Terminal() || rec.Result == nil:
		// The record was restored as live (for example after a store
		// failover); the job will end again. Ask later.
		_ = msg.NakWithDelay(d.cfg.RetryMax)
		return
	}
	// Attempts are counted in the record, not by deliveries: a delivery
	// deferred for its tenant's slots, or handed back at shutdown, is none.
	attempts := 1
	if rec.Callback != nil {
		attempts = rec.Callback.Attempts + 1
	}
	st := job.CallbackState{URL: rec.Message.Spec.CallbackURL, State: job.CallbackPending, Attempts: attempts}
	if st.URL == "" {
		st.URL = req.URL
	}
	now := d.cfg.Now().UTC()
	st.LastAttemptAt = &now

	secret, ok := d.cfg.Secrets(rec.Message.Tenant)
	var status int
	if !ok {
		err = fmt.Errorf("%w: no signing secret for tenant %q", errPermanent, rec.Message.Tenant)
	} else {
		status, err = d.post(ctx, st.URL, req.ID, d.resultBody(ctx, rec), secret, st.Attempts)
	}
	if ctx.Err() != nil {
		_ = msg.Nak() // shutting down: not the receiver's fault
		return
	}
	st.LastStatus = status
	var delay time.Duration
	switch {
	case err == nil:
		st.State, st.DeliveredAt = job.CallbackDelivered, &now
	case errors.Is(err, errPermanent), errors.Is(err, ErrRefusedAddress):
		st.State, st.LastError = job.CallbackFailed, err.Error()
	default:
		delay = d.backoff(st.Attempts)
		ended := req.EndedAt
		if ended.IsZero() {
			ended = meta.Timestamp
		}
		if next := now.Add(delay); next.Sub(ended) > d.cfg.MaxAge {
			st.State = job.CallbackFailed
			st.LastError = fmt.Sprintf("gave up after %d attempts over %v: %v", st.Attempts, now.Sub(ended).Round(time.Second), err)
		} else {
			st.LastError, st.NextAttemptAt = err.Error(), &next
		}
	}
	if err := d.cfg.Store.SetCallback(ctx, req.ID, st); err != nil {
		log.WarnContext(ctx, "callback: record delivery state", slog.Any("error", err))
	}
	log.InfoContext(ctx, "callback attempt", slog.String("state", string(st.State)), slog.Int("http_status", status),
		slog.String("error", st.LastError))
	if st.State == job.CallbackPending {
		_ = msg.NakWithDelay(delay)
		return
	}
	_ = msg.Ack()
}

// errPermanent marks an attempt that retrying cannot fix.
var errPermanent = errors.New("permanent failure")

// post sends one signed attempt. It returns the HTTP status (0 without an
// answer) and nil for 2xx, an error wrapping errPermanent for answers that a
// retry would not change, and another error for what a retry may fix.
func (d *Deliverer) post(ctx context.Context, url, id string, body func(io.Writer) error, secret []byte, attempt int) (int, error) {
	// The body is written twice, once into the signature and once onto the
	// wire, so that it need not be held in memory.
	at := d.cfg.Now()
	sig := newSigner(secret, at)
	if err := body(sig); err != nil {
		return 0, fmt.Errorf("encode the result: %w", err)
	}
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, pr)
	if err != nil {
		return 0, fmt.Errorf("%w: build request: %w", errPermanent, err)
	}
	req.ContentLength = sig.n
	go func() { pw.CloseWithError(body(pw)) }() // ends when the transport closes pr
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "kiln-callback/1")
	req.Header.Set(job.HeaderJobID, id)
	req.Header.Set(job.HeaderDeliveryAttempt, strconv.Itoa(attempt))
	req.Header.Set(job.HeaderSignature, sig.header())
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("post: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return c, nil
	case c >= 500, c == http.StatusRequestTimeout, c == http.StatusTooManyRequests:
		return c, fmt.Errorf("receiver answered %d", c)
	case c >= 300 && c < 400:
		return c, fmt.Errorf("%w: receiver answered %d (redirects are not followed)", errPermanent, c)
	default:
		return c, fmt.Errorf("%w: receiver answered %d", errPermanent, c)
	}
}

// backoff is the wait after the attempt-th failed attempt.
func (d *Deliverer) backoff(attempt int) time.Duration {
	delay := d.cfg.RetryInitial
	for i := 1; i < attempt && delay < d.cfg.RetryMax; i++ {
		delay *= 2
	}
	return min(delay, d.cfg.RetryMax)
}

// resultBody is the JSON sent: the job's Result as GET /v1/jobs/{id} shows
// it once the job has ended.
// A Result whose output is in the object store is read from it as the body
// is written, never held whole in memory.
func (d *Deliverer) resultBody(ctx context.Context, rec cache.Record) func(io.Writer) error {
	r := *rec.Result
	r.ID, r.Status = rec.Message.ID, rec.Status
	if r.CreatedAt == nil {
		r.CreatedAt = &rec.Message.CreatedAt
	}
	if r.FinishedAt == nil {
		r.FinishedAt = rec.FinishedAt
	}
	if r.TraceID == "" {
		r.TraceID = rec.Message.TraceID
	}
	open := func(ctx context.Context, ref job.ObjectRef) (io.ReadCloser, error) {
		return d.blobs.OpenSpooled(ctx, ref, "")
	}
	return func(w io.Writer) error {
		return resultio.Write(ctx, w, &r, func() ([]byte, error) { return json.Marshal(r) }, open)
	}
}
