package initproto

import (
	"errors"
	"testing"
)

// A status round-trips through its file with the right nonce, and is
// refused without it, with another one, empty, or of another version.
func TestParseChecksNonceAndVersion(t *testing.T) {
	const nonce = "6b696c6e2d6e6f6e6365"
	in := Status{Nonce: nonce, Ready: true, Signal: 9, CPUMicros: 1234, TimedOut: true}
	got, err := Parse(in.Encode(), nonce)
	if err != nil {
		t.Fatal(err)
	}
	in.Version = Version
	if got != in {
		t.Fatalf("round trip: got %+v, want %+v", got, in)
	}
	if _, err := Parse(in.Encode(), "another"); !errors.Is(err, ErrForged) {
		t.Errorf("another nonce: %v, want ErrForged", err)
	}
	if _, err := Parse(in.Encode(), ""); !errors.Is(err, ErrForged) {
		t.Errorf("no nonce expected: %v, want ErrForged", err)
	}
	forged := Status{Nonce: "", ExitCode: 0}
	if _, err := Parse(forged.Encode(), nonce); !errors.Is(err, ErrForged) {
		t.Errorf("a status without the nonce: %v, want ErrForged", err)
	}
	if _, err := Parse(nil, nonce); err == nil {
		t.Error("an empty status file parsed")
	}
	if _, err := Parse([]byte(`{"v":2,"nonce":"`+nonce+`"}`), nonce); err == nil {
		t.Error("a status of another version parsed")
	}
}
