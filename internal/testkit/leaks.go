package testkit

import "go.uber.org/goleak"

// NATSObjectPutLeak tells goleak to pass over the goroutine nats.go (up to
// v1.55.0, the newest served) can strand in an object store Put: Put
// publishes its chunks through a JetStream context of its own, whose first
// async publish starts resetPendingAcksOnReconnect; when the Put ends before
// that goroutine first takes the publisher's lock, the deferred
// cleanupReplySub has already set the status channel it reads to nil, and
// it blocks on the nil channel for good. It is not Kiln's goroutine and
// Kiln cannot end it; the packages whose tests put objects through
// internal/blob (worker, producer, internal/e2e) pass this to
// goleak.VerifyTestMain.
var NATSObjectPutLeak = goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect")

// RedisDialBackoff tells goleak to pass over the goroutine go-redis (v9.23)
// starts after a failed dial: it sleeps a second before dialling again and
// does not wake when its client is closed, so a suite that stops Redis
// shortly before it ends finds it still asleep. It ends on its own.
var RedisDialBackoff = goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")
