package cache

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"strings"
)

// Identity names the store this Store talks to — the server (or the
// Sentinels' master), the database and the key prefix, never a password —
// as a short stable token. Two processes with the same Identity share job
// records and worker leases; sandboxes label themselves with it so that only
// workers of the same store judge them by those leases.
func (s *Store) Identity() string {
	where := s.cfg.URL
	if u, err := url.Parse(s.cfg.URL); err == nil {
		u.User = nil
		if len(s.cfg.SentinelAddrs) > 0 {
			u.Host = "" // the Sentinels find the server; its address may change
		}
		where = u.String()
	}
	sum := sha256.Sum256([]byte(strings.Join([]string{where, s.cfg.SentinelMaster, strings.Join(s.cfg.SentinelAddrs, ","), s.cfg.Prefix}, "\x00")))
	return hex.EncodeToString(sum[:8])
}
