package callback

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestSignIsHMACOverTimestampDotBody(t *testing.T) {
	secret, body := []byte("whsec"), []byte(`{"id":"x"}`)
	at := time.Unix(1700000000, 0)
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "%d.%s", at.Unix(), body)
	want := "t=1700000000,v1=" + hex.EncodeToString(m.Sum(nil))
	if got := Sign(secret, at, body); got != want {
		t.Fatalf("Sign = %s; want %s", got, want)
	}
	if err := Verify(secret, want, body, at.Add(time.Minute), 5*time.Minute); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyRejects(t *testing.T) {
	secret, body := []byte("whsec"), []byte(`{"id":"x"}`)
	at := time.Unix(1700000000, 0)
	h := Sign(secret, at, body)
	for name, err := range map[string]error{
		"tampered body": Verify(secret, h, []byte(`{"id":"y"}`), at, time.Minute),
		"wrong secret":  Verify([]byte("other"), h, body, at, time.Minute),
		"stale":         Verify(secret, h, body, at.Add(10*time.Minute), 5*time.Minute),
		"malformed":     Verify(secret, "v1=abc", body, at, time.Minute),
	} {
		if !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: err = %v; want ErrBadSignature", name, err)
		}
	}
}
