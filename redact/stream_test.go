package redact

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// allKeys is output with every sample key, one per line.
func allKeys(seed uint64) (string, []sample) {
	ss := samples(seed)
	var b strings.Builder
	for i, s := range ss {
		fmt.Fprintf(&b, "step %d: ", i)
		fmt.Fprintf(&b, s.line, s.key)
	}
	return b.String(), ss
}

// streamed runs in through a Stream in chunks cut at the given points.
func streamed(d *Detector, in string, cuts []int) string {
	s := d.Stream()
	var out bytes.Buffer
	last := 0
	for _, c := range cuts {
		out.Write(s.Write([]byte(in[last:c])))
		last = c
	}
	out.Write(s.Write([]byte(in[last:])))
	out.Write(s.Flush())
	return out.String()
}

func TestStreamCatchesKeysSplitAnywhere(t *testing.T) {
	t.Parallel()
	d := mustNew(t, nil)
	in, ss := allKeys(3)
	want, _ := d.String(in)
	// Every key, cut at every byte: a key split across two chunks is
	// redacted exactly as in the whole output.
	for _, s := range ss {
		at := strings.Index(in, s.key)
		for k := 0; k <= len(s.key); k++ {
			if got := streamed(d, in, []int{at + k}); got != want {
				t.Fatalf("%s cut at byte %d: got\n%s\nwant\n%s", s.kind, k, got, want)
			}
		}
	}
	// And in chunks of every size from 1 to 64 bytes.
	for size := 1; size <= 64; size++ {
		var cuts []int
		for c := size; c < len(in); c += size {
			cuts = append(cuts, c)
		}
		got := streamed(d, in, cuts)
		if got != want {
			t.Fatalf("chunks of %d bytes: got\n%s\nwant\n%s", size, got, want)
		}
		for _, s := range ss {
			if strings.Contains(got, s.key) {
				t.Fatalf("chunks of %d: %s key kept", size, s.kind)
			}
		}
	}
}

func TestStreamCountsWhatItReplaced(t *testing.T) {
	t.Parallel()
	in, ss := allKeys(4)
	s := mustNew(t, nil).Stream()
	for i := 0; i < len(in); i += 7 {
		s.Write([]byte(in[i:min(len(in), i+7)]))
	}
	s.Flush()
	want := Counts{}
	for _, x := range ss {
		want[x.kind]++
	}
	if fmt.Sprint(s.Counts()) != fmt.Sprint(want) {
		t.Fatalf("counts %v, want %v", s.Counts(), want)
	}
}

func TestStreamIdleReleasesCompleteLinesOnly(t *testing.T) {
	t.Parallel()
	s := mustNew(t, nil).Stream()
	if got := s.Write([]byte("loading...\nEnter your name: ")); len(got) != 0 {
		t.Fatalf("short output sent before its window filled: %q", got)
	}
	if got := string(s.Idle()); got != "loading...\n" {
		t.Fatalf("idle released %q, want the complete line", got)
	}
	// A PEM block whose END line has not come yet is held whole, lines and all.
	s = mustNew(t, nil).Stream()
	head := "key:\n-----BEGIN " + "OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAAB\n"
	got := string(s.Write([]byte(head))) + string(s.Idle())
	if got != "key:\n" {
		t.Fatalf("released %q while the key was still coming", got)
	}
	got = string(s.Write([]byte("-----END "+"OPENSSH PRIVATE KEY-----\nbye\n"))) + string(s.Flush())
	if got != "[REDACTED:private_key]\nbye\n" {
		t.Fatalf("end released %q", got)
	}
}

func TestStreamOffPassesThrough(t *testing.T) {
	t.Parallel()
	s := mustNew(t, &job.RedactPolicy{Mode: job.RedactOff}).Stream()
	if got := string(s.Write([]byte("AKIA"))); got != "AKIA" {
		t.Fatalf("off stream held or changed output: %q", got)
	}
}

func TestStreamBoundsWhatItHolds(t *testing.T) {
	t.Parallel()
	s := mustNew(t, nil).Stream()
	pem := "-----BEGIN " + "RSA PRIVATE KEY-----\n" + strings.Repeat("QUJD\n", MaxHeldBytes/5+10)
	out := s.Write([]byte(pem))
	if len(s.carry) > MaxHeldBytes || len(out) == 0 {
		t.Fatalf("holds %d bytes (bound %d), released %d", len(s.carry), MaxHeldBytes, len(out))
	}
	if !bytes.HasPrefix(out, []byte(Replacement(KindPrivateKey))) {
		t.Fatalf("released the held block unredacted: %.60q", out)
	}
}
