package callback

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"time"
)

// Sign returns the Kiln-Signature header value for body sent at t:
// "t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<unix seconds>.<body>")>".
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// ErrBadSignature is returned by Verify for a missing, malformed, wrong or stale signature.
var ErrBadSignature = errors.New("bad callback signature")

// Verify checks a Kiln-Signature header value against body: the HMAC must
// match and its timestamp be within tolerance of now (which bounds replays).
// Receivers written in Go can call it as is; README shows the same in Python.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			if b, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, b)
			}
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return fmt.Errorf("%w: want t=<unix>,v1=<hex>, got %q", ErrBadSignature, header)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: timestamp %d is %v away from now (tolerance %v)", ErrBadSignature, sec, d.Round(time.Second), tolerance)
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			return nil
		}
	}
	return fmt.Errorf("%w: no v1 signature matches", ErrBadSignature)
}

// signer computes the signature of a body written into it.
type signer struct {
	ts  string
	mac hash.Hash
	n   int64
}

func newSigner(secret []byte, t time.Time) *signer {
	s := &signer{ts: strconv.FormatInt(t.Unix(), 10), mac: hmac.New(sha256.New, secret)}
	s.mac.Write([]byte(s.ts))
	s.mac.Write([]byte{'.'})
	return s
}

func (s *signer) Write(p []byte) (int, error) {
	s.n += int64(len(p))
	return s.mac.Write(p)
}

// header is the Kiln-Signature value for what was written (as Sign gives).
func (s *signer) header() string {
	return "t=" + s.ts + ",v1=" + hex.EncodeToString(s.mac.Sum(nil))
}
