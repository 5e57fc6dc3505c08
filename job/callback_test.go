package job

import (
	"errors"
	"strings"
	"testing"
)

func TestCallbackURLForm(t *testing.T) {
	ok := []string{"", "https://example.com/kiln", "http://example.com:8080/h?x=1"}
	for _, u := range ok {
		if err := (Spec{Code: "x", CallbackURL: u}).Validate(); err != nil {
			t.Errorf("%q: %v", u, err)
		}
	}
	bad := map[string]string{
		"ftp://example.com/x":                               "scheme",
		"https:///path":                                     "no host",
		"https://user:pw@example.com/x":                     "credentials",
		"https://example.com/x#frag":                        "fragment",
		"https://" + strings.Repeat("a", MaxCallbackURLLen): "maximum",
	}
	for u, want := range bad {
		err := (Spec{Code: "x", CallbackURL: u}).Validate()
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Field != "callback_url" || !strings.Contains(ie.Message, want) {
			t.Errorf("%.40q: err = %v; want callback_url refused mentioning %q", u, err, want)
		}
	}
}

func TestCallbackURLIsNotInTheCacheKey(t *testing.T) {
	a := Spec{Runtime: "python", Code: "print(1)"}
	b := a
	b.CallbackURL = "https://example.com/k"
	if Key(a, "sha256:x") != Key(b, "sha256:x") {
		t.Fatal("callback_url changes the cache key")
	}
}
