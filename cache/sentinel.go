package cache

import (
	"fmt"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// validateSentinel checks the Sentinel fields: a master name goes with
// addresses, and every address is host:port.
func (c Config) validateSentinel() error {
	if len(c.SentinelAddrs) == 0 {
		if c.SentinelMaster != "" {
			return fmt.Errorf("cache config: SentinelMaster %q is set but SentinelAddrs is empty; give the Sentinels' host:port addresses", c.SentinelMaster)
		}
		return nil
	}
	if c.SentinelMaster == "" {
		return fmt.Errorf("cache config: SentinelAddrs is set but SentinelMaster is empty; give the master name the Sentinels monitor")
	}
	for _, a := range c.SentinelAddrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("cache config: SentinelAddrs: %q is not host:port: %w", a, err)
		}
	}
	return nil
}

// newClient is a client of the server URL names, or, with Sentinels
// configured, of whichever server they report as the primary: go-redis asks
// them at connect time and drops its connections when they announce a
// failover (+switch-master), so commands go to the new primary.
func newClient(cfg Config, opt *redis.Options) *redis.Client {
	if len(cfg.SentinelAddrs) == 0 {
		return redis.NewClient(opt)
	}
	return redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:       cfg.SentinelMaster,
		SentinelAddrs:    cfg.SentinelAddrs,
		SentinelPassword: cfg.SentinelPassword,
		// Writes go to the primary only; Kiln never reads from replicas
		// (they may lag behind a write the same job just made).
		Username:              opt.Username,
		Password:              opt.Password,
		DB:                    opt.DB,
		TLSConfig:             opt.TLSConfig,
		DialTimeout:           opt.DialTimeout,
		ReadTimeout:           opt.ReadTimeout,
		WriteTimeout:          opt.WriteTimeout,
		PoolTimeout:           opt.PoolTimeout,
		PoolSize:              opt.PoolSize,
		MinIdleConns:          opt.MinIdleConns,
		MaxRetries:            opt.MaxRetries,
		DialerRetries:         opt.DialerRetries,
		ContextTimeoutEnabled: opt.ContextTimeoutEnabled,
		DisableIdentity:       opt.DisableIdentity,
	})
}

// serverDesc names the server for an error: URL's address, or the master
// name and its Sentinels.
func serverDesc(cfg Config, opt *redis.Options) string {
	if len(cfg.SentinelAddrs) == 0 {
		return opt.Addr
	}
	return fmt.Sprintf("master %q via sentinels %s", cfg.SentinelMaster, strings.Join(cfg.SentinelAddrs, ","))
}
