package producer

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// FuzzCheckFieldNames: the scan never panics, never loops, and never
// refuses a valid body whose keys are all documented and distinct.
func FuzzCheckFieldNames(f *testing.F) {
	for _, s := range []string{
		`{"code":"print(1)","limits":{"memory_mb":64},"files":[{"name":"a","content":"\"x\\"}],"env":{"A":"1","a":"2"},"cache":{"max_age_s":5}}`,
		`{"code":"x","CODE":"y"}`, `{"code":"\u0063","\u0063ode":"y"}`, `[[[[`, `{"a":`, `"`, `{"code":"x"}{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		p := checkFieldNames(raw, specSchema, "")
		if p == nil || !json.Valid(raw) {
			return
		}
		if p.Type != job.ProblemDuplicateField && p.Type != job.ProblemFieldNameCase && p.Type != job.ProblemUnknownField {
			t.Fatalf("%q: unexpected problem %+v", raw, p)
		}
	})
}

func TestCheckFieldNamesSurvivesMutations(t *testing.T) {
	t.Parallel()
	base := []byte(`{"code":"print(1)","stdin":"a\"b","limits":{"memory_mb":64,"pids":[1,{"x":[]}]},"files":[{"name":"a","content":"x"}],"env":{"A":"1"},"cache":true}`)
	// (pids holds an array here only to give the scan nesting to walk.)
	if p := checkFieldNames(base, specSchema, ""); p != nil {
		t.Fatalf("valid body refused: %+v", p)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte(`{}[]":,\ aCODEcode0`)
	for range 20000 {
		b := append([]byte(nil), base...)
		for range 1 + rng.IntN(4) {
			b[rng.IntN(len(b))] = alphabet[rng.IntN(len(alphabet))]
		}
		checkFieldNames(b, specSchema, "") // must not panic or hang
	}
	deep := strings.Repeat("[", 200000) + strings.Repeat("]", 200000)
	if p := checkFieldNames([]byte(`{"args":`+deep+`}`), specSchema, ""); p != nil {
		t.Fatalf("deep nesting: %+v (left to the decoder)", p)
	}
}
