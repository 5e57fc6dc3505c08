package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/redis/go-redis/v9"
)

// usage is what the pipeline's NATS server and Redis had done and held at
// one moment: the per-job figures docs/capacity.md plans from are the
// differences between two of them over a run of jobs.
type usage struct {
	natsIn, natsOut           int64 // messages the NATS server received and sent
	natsInBytes, natsOutBytes int64
	jsBytes                   uint64 // bytes JetStream stores, every stream
	jsMsgs                    uint64
	redisCmds                 int64 // commands Redis processed
	redisMem                  int64 // bytes Redis holds for data (used_memory)
	redisKeys                 int64
}

// usageNow reads the pipeline's NATS server and Redis.
func (p *pipeline) usageNow(ctx context.Context) (usage, error) {
	var u usage
	vz, err := p.ns.Varz(nil)
	if err != nil {
		return u, fmt.Errorf("nats varz: %w", err)
	}
	u.natsIn, u.natsOut, u.natsInBytes, u.natsOutBytes = vz.InMsgs, vz.OutMsgs, vz.InBytes, vz.OutBytes
	js, err := p.ns.Jsz(&server.JSzOptions{})
	if err != nil {
		return u, fmt.Errorf("nats jsz: %w", err)
	}
	u.jsBytes, u.jsMsgs = js.Store, js.Messages
	rc := redis.NewClient(&redis.Options{Addr: p.rds.addr()})
	defer rc.Close()
	info, err := rc.Info(ctx, "stats", "memory", "keyspace").Result()
	if err != nil {
		return u, fmt.Errorf("redis info: %w", err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "total_commands_processed":
			u.redisCmds, _ = strconv.ParseInt(v, 10, 64)
		case "used_memory":
			u.redisMem, _ = strconv.ParseInt(v, 10, 64)
		case "db0":
			// keys=N,expires=M,avg_ttl=T
			keys, _, _ := strings.Cut(strings.TrimPrefix(v, "keys="), ",")
			u.redisKeys, _ = strconv.ParseInt(keys, 10, 64)
		}
	}
	return u, nil
}

// printPerJob prints what one job cost each store, from two readings
// around a run of jobs (docs/capacity.md).
func printPerJob(before, after usage, jobs int) {
	n := float64(jobs)
	fmt.Printf("  per job (the run above, %d jobs): NATS %.1f messages in, %.1f out (%.1f KiB in, %.1f KiB out); JetStream stores %.1f messages, %.1f KiB more;\n",
		jobs, float64(after.natsIn-before.natsIn)/n, float64(after.natsOut-before.natsOut)/n,
		float64(after.natsInBytes-before.natsInBytes)/n/1024, float64(after.natsOutBytes-before.natsOutBytes)/n/1024,
		float64(int64(after.jsMsgs)-int64(before.jsMsgs))/n, float64(int64(after.jsBytes)-int64(before.jsBytes))/n/1024)
	fmt.Printf("    Redis %.1f commands, %.1f keys and %.1f KiB held more (records, results, their indexes; until their TTL)\n",
		float64(after.redisCmds-before.redisCmds)/n, float64(after.redisKeys-before.redisKeys)/n, float64(after.redisMem-before.redisMem)/n/1024)
}
