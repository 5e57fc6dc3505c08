package cache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kilnrun/kiln/job"
)

// The Results remember, per result-cache key, the last small entry
// LookupResult read, decoded. The API's cache-hit path then answers a hit
// of that entry in one round trip instead of two, and decodes nothing:
// CreateHitOfKnown (hittx.go) records the hit in a transaction that reads
// the entry, and the hit stands only if the entry in Redis is still, byte
// for byte, the one remembered; CreateAliasOfKnown does the same in a
// script for an id an Idempotency-Key names. The memory
// never answers on its own, so an entry that expired, was replaced or was
// removed is seen as such at once, as a GET would see it; a tenant can only
// be answered with an entry of its own cache scope, since the key (which
// holds the scope) is what is looked up and checked.
const (
	// knownMaxValueBytes bounds a remembered entry's stored form: the
	// check reads it back (and a script's is sent it) with every hit, so
	// larger entries take the GET path.
	knownMaxValueBytes = 8 << 10
	// knownMaxEntries bounds the entries remembered; one more forgets an
	// arbitrary one.
	knownMaxEntries = 4096
)

// KnownResult is a result-cache entry this process read and remembers: the
// decoded Result (shared: callers must not modify what its slices and maps
// hold) and the stored form a hit checks Redis against.
type KnownResult struct {
	Key    string
	Result job.Result
	raw    string
	// copyID is raw's SHA-256 (hex): the name of the hit-result copy the
	// records of its hits name (hittx.go).
	copyID string
	// copyAt is when (Results.since) a transaction of this process last
	// set the copy's TTL, once it was answered; 0 before.
	copyAt atomic.Int64
	// msg is the light message template of this entry's hits (hitmsg.go),
	// made at the first hit and again when a hit of another tenant of the
	// cache group does not fit it.
	msg atomic.Pointer[hitMsgTemplate]
}

// knownResults is the Results' memory of entries, safe for concurrent use.
type knownResults struct {
	mu sync.RWMutex
	m  map[string]*KnownResult
}

func (k *knownResults) get(key string) (*KnownResult, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	r, ok := k.m[key]
	return r, ok
}

// note remembers raw as key's entry, unless it is too large or already
// remembered. It decodes raw itself, so the caller's Result shares nothing
// with the remembered one.
func (k *knownResults) note(key string, raw []byte) {
	if len(raw) > knownMaxValueBytes {
		k.forget(key, nil)
		return
	}
	if r, ok := k.get(key); ok && r.raw == string(raw) {
		return
	}
	res, err := decodeResult(raw)
	if err != nil {
		return
	}
	sum := sha256.Sum256(raw)
	r := &KnownResult{Key: key, Result: res, raw: string(raw), copyID: hex.EncodeToString(sum[:])}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]*KnownResult{}
	}
	if _, ok := k.m[key]; !ok && len(k.m) >= knownMaxEntries {
		for other := range k.m {
			delete(k.m, other)
			break
		}
	}
	k.m[key] = r
}

// forget drops key's entry; when r is set, only if it still is r.
func (k *knownResults) forget(key string, r *KnownResult) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if cur, ok := k.m[key]; ok && (r == nil || cur == r) {
		delete(k.m, key)
	}
}

// KnownResult returns the result-cache entry of key this process last read
// with LookupResult, when it remembers one. It does no I/O: whether the
// entry is still the one in Redis is checked by CreateHitOfKnown or
// CreateAliasOfKnown.
func (s *Results) KnownResult(key string) (*KnownResult, bool) { return s.known.get(key) }

// HitOf is res as the answer to a submission (job id, trace traceID, made
// at) found in the result cache: the cached outcome under the new id.
// Nothing ran, so the run's own timing and placement fields (queue,
// attempt, worker, start) are left out. The API answers with it, and a
// cache-hit record reads back as it.
func HitOf(res job.Result, id, traceID string, at time.Time) job.Result {
	res.ID = id
	res.CacheHit = true
	res.CreatedAt = &at
	res.FinishedAt = &at
	res.StartedAt = nil
	res.QueueMS, res.Attempt, res.Worker = 0, 0, ""
	res.TraceID = traceID
	return res
}

// CreateAliasOfKnown records msg as a cache hit of known's entry, as
// CreateAlias does (a record born terminal, read back as HitOf the entry
// under msg's id, trace id and created_at), only while known's entry is
// still the one in Redis, checked in the same script: one round trip for a
// cache hit. The record holds the entry as stored, so nothing of the result
// is encoded or sent again. It returns false, and records nothing, when the
// entry is gone or has changed (and forgets it); the caller then reads the
// entry with LookupResult. A record already holding the id is left alone.
// A submission whose id no one else can know takes CreateHitOfKnown.
func (s *Results) CreateAliasOfKnown(ctx context.Context, known *KnownResult, msg job.Message) (bool, error) {
	op := "create cache-hit record " + msg.ID
	rawMsg, err := known.hitArgs(op, &msg)
	if err != nil {
		return false, err
	}
	keys := append([]string{s.keys.job(msg.ID), s.keys.result(known.Key)}, s.index.sets(msg, known.Result.Status)...)
	n, err := createKnownAliasScript.Run(ctx, s.rdb, keys,
		rawMsg, string(known.Result.Status), formatTime(msg.CreatedAt), s.jobTTL, known.raw,
		msg.ID, s.index.bound(), s.keys.jobIndex(msg.TenantOrDefault())).Int()
	if err != nil {
		return false, fail(op, err)
	}
	if n < 0 {
		s.known.forget(known.Key, known)
		return false, nil
	}
	return true, nil
}

// hitArgs checks a hit of k for msg and returns its light message.
func (k *KnownResult) hitArgs(op string, msg *job.Message) ([]byte, error) {
	if msg.ID == "" || !k.Result.Status.Terminal() {
		return nil, fmt.Errorf("%s: needs an id and a terminal result (status %q)", op, k.Result.Status)
	}
	rawMsg, err := k.lightMessage(msg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return rawMsg, nil
}

// lightMessage is msg's light message, from the entry's template when msg
// fits it.
func (k *KnownResult) lightMessage(msg *job.Message) ([]byte, error) {
	t := k.msg.Load()
	if t == nil || !t.fits(msg) {
		if t = newHitMsgTemplate(*msg); t == nil || !t.fits(msg) {
			return lightMessage(*msg)
		}
		k.msg.Store(t)
	}
	return t.append(make([]byte, 0, len(t.mid)+len(t.tail)+160), msg), nil
}

// createKnownAliasScript: KEYS[1] job, KEYS[2] result-cache entry,
// KEYS[3..] the job index sets the job enters (jobindex.go); ARGV msg JSON,
// status, finished_at, TTL ms, the entry's expected stored form, id, index
// trim bound, the job index. Returns -1 when the entry is not that (gone or
// changed), and records nothing; else as createAliasScript: 1 created, 0 a
// record exists. The record's result is the entry itself, its cache_hit
// field 1 (decodeRecord reads it as the hit).
var createKnownAliasScript = redis.NewScript(indexLua + `
local entry = redis.call('GET', KEYS[2])
if entry ~= ARGV[5] then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'msg', ARGV[1], 'status', ARGV[2], 'result', entry, 'finished_at', ARGV[3], 'attempt', '0', 'cache_hit', '1', 'index', ARGV[8])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
for i = 3, #KEYS do
  index_add(KEYS[i], ARGV[6], ARGV[7], ARGV[4])
end
return 1
`)
