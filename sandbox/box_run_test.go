package sandbox

import (
	"bufio"
	"math/rand/v2"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// A box's inner sandboxes never take the uid of the one before them: two
// jobs in a row (of one tenant or, in a neutral box, of two) are two uids,
// each of the others as likely.
func TestJobUIDNeverRepeats(t *testing.T) {
	t.Parallel()
	span := boxJobUIDMax - boxJobUIDMin
	for _, last := range []int{0, boxJobUIDMin, boxJobUIDMin + 1, 30000, boxJobUIDMax - 2, boxJobUIDMax - 1} {
		seen, drawn := map[int]bool{}, map[int]bool{}
		for _, draw := range []int{0, 1, last - boxJobUIDMin - 1, last - boxJobUIDMin, last - boxJobUIDMin + 1, span - 2} {
			if draw < 0 || draw > span-2 || drawn[draw] {
				continue
			}
			drawn[draw] = true
			uid := jobUID(last, func(n int) int {
				if n != span-1 {
					t.Fatalf("drawn among %d uids; want %d (all but the last)", n, span-1)
				}
				return draw
			})
			if uid == last || uid < boxJobUIDMin || uid >= boxJobUIDMax || seen[uid] {
				t.Errorf("last %d, draw %d: uid %d; want another uid of the range, one per draw", last, draw, uid)
			}
			seen[uid] = true
		}
	}
	last := 0
	for range 10000 {
		uid := jobUID(last, rand.IntN)
		if uid == last {
			t.Fatalf("uid %d twice in a row", uid)
		}
		last = uid
	}
}

// A zygote that ends as it is handed a run (it refused the run's header,
// or crashed) leaves the run to watch, which reports the zygote's end with
// its last word: the handing over is not a fault of its own kind, whatever
// part of the header the zygote read before it ended.
func TestBoxRunHandedToAnEndedZygoteIsWatched(t *testing.T) {
	t.Parallel()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "ctl")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	ours, zygote := conn(fds[0]), conn(fds[1])
	defer ours.Close()
	zygote.Close() // the zygote ended
	sb := &sandbox{id: "kiln-test-box", stdout: newCappedBuffer(1 << 10), stderr: newCappedBuffer(1 << 10),
		box: &boxState{ctl: ours, ctlReader: bufio.NewReader(ours)}}
	tg := &boxTarget{b: &boxClient{}, sb: sb, frame: []byte("frame"), stdin: "in"}
	if err := tg.deliver(t.Context()); err != nil || tg.undelivered == nil {
		t.Fatalf("deliver to an ended zygote: %v (undelivered: %v); want the run left to watch, known as undelivered", err, tg.undelivered)
	}
	if _, err := sb.box.ctlReader.ReadByte(); err == nil {
		t.Fatal("the ended zygote's socket gave a byte; want its end, which watch reports")
	}
	for range 2 { // the job's ends went with the header: its streams end
		select {
		case <-tg.outs.done:
		case <-t.Context().Done():
			t.Fatal("the run's streams did not end")
		}
	}

	// Our own end closed is no zygote's end: it is an error of its own.
	ours.Close()
	tg = &boxTarget{b: &boxClient{}, sb: sb, frame: []byte("frame")}
	if err := tg.deliver(t.Context()); err == nil {
		t.Fatal("deliver on a closed control socket: no error")
	}
}
