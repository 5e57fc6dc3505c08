package cache

import "context"

// Open is New for a process that must start while Redis is down or still
// loading its data: when the server does not answer yet, it logs that and
// returns the Store anyway; every call fails with ErrUnavailable until the
// server answers, and the client connects on the first call after that.
// Errors that waiting cannot fix (a bad URL, a wrong password) still fail.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg.connectLater = true
	return New(ctx, cfg)
}
