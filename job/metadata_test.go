package job

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateMetadata(t *testing.T) {
	many := Metadata{}
	for i := range MaxMetadataKeys + 1 {
		many[string(rune('a'+i))] = "v"
	}
	for _, c := range []struct {
		m     Metadata
		field string // "" when valid
	}{
		{nil, ""},
		{Metadata{"team": "research", "run.id": "r-1", "k8s:ns": ""}, ""},
		{Metadata{"team": strings.Repeat("x", MaxMetadataValueBytes)}, ""},
		{many, "metadata"},
		{Metadata{"": "x"}, "metadata"},
		{Metadata{"a b": "x"}, "metadata"},
		{Metadata{"k=v": "x"}, "metadata"},
		{Metadata{strings.Repeat("k", MaxMetadataKeyBytes+1): "x"}, "metadata"},
		{Metadata{"team": strings.Repeat("x", MaxMetadataValueBytes+1)}, "metadata.team"},
		{Metadata{"team": "a\x00b"}, "metadata.team"},
		{Metadata{"team": "\xff"}, "metadata.team"},
	} {
		err := ValidateMetadata("metadata", c.m)
		var inv *InvalidError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%v: %v; want valid", c.m, err)
		case c.field != "" && (!errors.As(err, &inv) || inv.Field != c.field):
			t.Errorf("%v: %v; want an invalid %s", c.m, err, c.field)
		}
	}
}

// Metadata labels a job: two jobs that differ only in it are the same
// computation, so they share a cache key.
func TestMetadataIsNotInTheCacheKey(t *testing.T) {
	a := Spec{Runtime: "python", Code: "print(1)", Metadata: Metadata{"team": "a"}}
	b := Spec{Runtime: "python", Code: "print(1)", Metadata: Metadata{"team": "b", "x": "y"}}
	if Key(a, "sha256:1") != Key(b, "sha256:1") {
		t.Error("metadata changed the cache key")
	}
}

func TestParseTag(t *testing.T) {
	k, v, err := ParseTag("team=a=b")
	if err != nil || k != "team" || v != "a=b" {
		t.Errorf("team=a=b: %q %q %v", k, v, err)
	}
	if k, v, err := ParseTag("team="); err != nil || k != "team" || v != "" {
		t.Errorf("team=: %q %q %v", k, v, err)
	}
	for _, bad := range []string{"team", "=x", "a b=c"} {
		if _, _, err := ParseTag(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
	m := Metadata{"team": "a", "env": "prod"}
	if !m.Matches(Metadata{"team": "a"}) || m.Matches(Metadata{"team": "b"}) || m.Matches(Metadata{"other": ""}) || !m.Matches(nil) {
		t.Error("Matches")
	}
}
