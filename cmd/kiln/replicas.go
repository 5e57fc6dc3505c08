package main

import (
	"flag"
	"time"

	"github.com/kilnrun/kiln/cache"
)

// replicaConfig is how many Redis replicas must hold a job's result before
// a worker acks the job's message (cache.Config.MinReplicas and
// ReplicaWait), for a worker on Redis with replicas (Sentinel).
type replicaConfig struct {
	MinReplicas int           // default 0: no WAIT
	Wait        time.Duration // one WAIT's bound; default cache.ReplicaWaitDefault (1s)
}

func replicaFlags(fs *flag.FlagSet, c *replicaConfig) {
	intVar(fs, &c.MinReplicas, "redis-min-replicas", "KILN_REDIS_MIN_REPLICAS", 0, "Redis replicas that must hold a job's result before its queue message is acked (Redis WAIT); 1 with Sentinel, so that a failover cannot lose a finished job (0: no WAIT, for a single server)")
	durationVar(fs, &c.Wait, "redis-replica-wait", "KILN_REDIS_REPLICA_WAIT", cache.ReplicaWaitDefault, "how long one WAIT for --redis-min-replicas waits before the result is written again")
}

// apply sets cc's replica fields.
func (c replicaConfig) apply(cc cache.Config) cache.Config {
	cc.MinReplicas, cc.ReplicaWait = c.MinReplicas, c.Wait
	return cc
}
