package job

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestCachePolicyJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want CachePolicy
		out  string
	}{
		{`true`, CachePolicy{}, `true`},
		{`false`, CachePolicy{Off: true}, `false`},
		{`{"max_age_s": 30}`, CachePolicy{MaxAgeS: 30}, `{"max_age_s":30}`},
	} {
		var s Spec
		if err := json.Unmarshal([]byte(`{"code":"x","cache":`+tc.in+`}`), &s); err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if s.Cache == nil || *s.Cache != tc.want {
			t.Fatalf("%s decoded as %+v, want %+v", tc.in, s.Cache, tc.want)
		}
		b, _ := json.Marshal(s.Cache)
		if string(b) != tc.out {
			t.Fatalf("%s encoded as %s, want %s", tc.in, b, tc.out)
		}
	}
	for _, bad := range []string{`1`, `"yes"`, `{}`, `{"max_age_s": 0}`, `{"max_age_s": -5}`, `{"max_age_s": 1.5}`, `{"max_age_s": 1, "x": 2}`, `null`} {
		var s Spec
		err := json.Unmarshal([]byte(`{"code":"x","cache":`+bad+`}`), &s)
		if bad == `null` {
			if err != nil || s.Cache != nil {
				t.Fatalf("null: err %v, cache %+v; want absent", err, s.Cache)
			}
			continue
		}
		var ie *InvalidError
		if !errors.As(err, &ie) {
			t.Fatalf("%s: err %v, want *InvalidError", bad, err)
		}
	}
}

func TestScopedKeySeparatesScopes(t *testing.T) {
	t.Parallel()
	s := Spec{Runtime: "python", Code: "print(1)"}
	a, b := ScopedKey("alice", s, "sha256:1"), ScopedKey("bob", s, "sha256:1")
	if a == b || a == Key(s, "sha256:1") {
		t.Fatal("scoped keys of different scopes must differ from each other and from the unscoped key")
	}
	if ScopedKey("", s, "sha256:1") != Key(s, "sha256:1") {
		t.Fatal("the empty scope must be Key itself")
	}
	if ScopedKey("alice", s, "sha256:2") == a {
		t.Fatal("a new image digest must change the scoped key")
	}
	m := Message{Spec: s, CacheScope: "alice"}
	if m.CacheKey("sha256:1") != a {
		t.Fatal("Message.CacheKey must use the message's scope")
	}
}
