package main

import (
	"flag"
	"io"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// TestDevFlagsAreWired sets each flag `kiln dev -h` lists, one at a time,
// to a value other than its default, and fails for any flag that changes
// nothing kiln dev runs with: a flag accepted and ignored.
func TestDevFlagsAreWired(t *testing.T) {
	t.Parallel()
	parse := func(args ...string) devConfig {
		t.Helper()
		fs := flag.NewFlagSet("kiln dev", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		finish := devFlags(fs)
		if err := parseFlagsEnv(fs, args, func(string) (string, bool) { return "", false }); err != nil {
			t.Fatalf("parse %v: %v", args, err)
		}
		return finish()
	}
	def := parse()
	fs := flag.NewFlagSet("kiln dev", flag.ContinueOnError)
	devFlags(fs)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		v := otherValue(t, f)
		if got := parse("--"+f.Name, v); reflect.DeepEqual(got, def) {
			t.Errorf("--%s %s changes nothing kiln dev runs with", f.Name, v)
		}
	})
	if n < 30 {
		t.Fatalf("only %d flags listed; the test lost sight of them", n)
	}
	// What the API and the worker share is one flag, given to both.
	c := parse("--redis-url", "redis://127.0.0.1:1/2", "--queue-max-msgs", "7", "--metrics-addr", "127.0.0.1:0")
	if c.Worker.RedisURL != c.API.RedisURL || c.Worker.QueueMaxMsgs != 7 || c.Worker.MetricsAddr != "127.0.0.1:0" {
		t.Fatalf("shared settings not shared: api %+v worker %+v", c.API, c.Worker)
	}
	if def.Worker.MetricsAddr != "" {
		t.Fatalf("kiln dev serves the worker's endpoints on %q by default; want none (the API's address serves /metrics)", def.Worker.MetricsAddr)
	}
}

// otherValue is a value for f that is not its default.
func otherValue(t *testing.T, f *flag.Flag) string {
	t.Helper()
	switch v := f.Value.(flag.Getter).Get().(type) {
	case bool:
		return strconv.FormatBool(!v)
	case int:
		return strconv.Itoa(v + 3)
	case int64:
		return strconv.FormatInt(v+3, 10)
	case time.Duration:
		return (v + 7*time.Second).String()
	case string:
		return v + "x"
	default:
		t.Fatalf("--%s: no test value for a %T", f.Name, v)
		return ""
	}
}

func TestPoolMaxZeroTurnsThePoolOff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args     []string
		min, max int
	}{
		{[]string{"--pool-max", "0"}, 0, 0},
		{[]string{"--pool-max", "3"}, 1, 3},
		{[]string{"--pool-max", "3", "--pool-min", "2"}, 2, 3},
		{[]string{}, 1, 2},
	} {
		fs := flag.NewFlagSet("kiln worker", flag.ContinueOnError)
		var cfg workerConfig
		workerFlags(fs, &cfg, true)
		if err := parseFlagsEnv(fs, tc.args, func(string) (string, bool) { return "", false }); err != nil {
			t.Fatal(err)
		}
		pool := cfg.poolConfig()
		if err := pool.Validate(); err != nil {
			t.Fatalf("%v: the worker would not start: %v", tc.args, err)
		}
		if pool.Min != tc.min || pool.Max != tc.max {
			t.Fatalf("%v: pool min %d max %d; want %d %d", tc.args, pool.Min, pool.Max, tc.min, tc.max)
		}
	}
}
