package queue

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// MinServerVersion is the oldest nats-server Kiln runs on: the job stream
// and consumer rely on JetStream as of 2.10 (consumer back-off and
// redelivery semantics; Debian bookworm's 2.9 is too old). Kiln is tested
// with the server module in go.mod, which `make up` and the tests embed.
const MinServerVersion = "2.10.0"

// CheckServerVersion fails when nc is connected to a nats-server older than
// MinServerVersion. Not connected: nil (checked again on the next try).
func CheckServerVersion(nc *nats.Conn) error {
	v := nc.ConnectedServerVersion()
	if v == "" {
		return nil
	}
	if olderThan(v, MinServerVersion) {
		return fmt.Errorf("nats-server %s is too old: Kiln needs %s or later", v, MinServerVersion)
	}
	return nil
}

// olderThan compares dotted numeric versions ("2.9.10" < "2.10.0"),
// ignoring pre-release and build suffixes.
func olderThan(v, min string) bool {
	parse := func(s string) [3]int {
		s, _, _ = strings.Cut(strings.TrimPrefix(s, "v"), "-")
		s, _, _ = strings.Cut(s, "+")
		var out [3]int
		for i, p := range strings.SplitN(s, ".", 3) {
			out[i], _ = strconv.Atoi(p)
		}
		return out
	}
	a, b := parse(v), parse(min)
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}
