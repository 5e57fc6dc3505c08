package main

import (
	"flag"
	"os"
	"strings"

	"github.com/kilnrun/kiln/cache"
)

// sentinelConfig is how `kiln api` and `kiln worker` reach Redis through
// Redis Sentinel. With Addrs empty (the default) they connect to
// --redis-url's host directly; with Addrs set, --redis-url gives only the
// password, database, TLS and timeouts.
type sentinelConfig struct {
	Addrs  string // comma-separated host:port of the Sentinels; default none
	Master string // master name the Sentinels monitor; default "kiln"
	// Password authenticates to the Sentinels (their requirepass), from
	// KILN_REDIS_SENTINEL_PASSWORD only (never a flag: ps shows flags).
	Password string
}

func sentinelFlags(fs *flag.FlagSet, c *sentinelConfig) {
	stringVar(fs, &c.Addrs, "redis-sentinels", "KILN_REDIS_SENTINELS", "", "Redis Sentinel addresses, comma-separated host:port; when set, the Redis primary is found (and followed across failovers) through them")
	stringVar(fs, &c.Master, "redis-master", "KILN_REDIS_MASTER", "kiln", "master name the Sentinels monitor (with --redis-sentinels)")
	c.Password = os.Getenv("KILN_REDIS_SENTINEL_PASSWORD")
}

// apply sets cc's Sentinel fields when Sentinels are configured.
func (c sentinelConfig) apply(cc cache.Config) cache.Config {
	for _, a := range strings.Split(c.Addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cc.SentinelAddrs = append(cc.SentinelAddrs, a)
		}
	}
	if len(cc.SentinelAddrs) > 0 {
		cc.SentinelMaster, cc.SentinelPassword = c.Master, c.Password
	}
	return cc
}
