package resultio

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// memStore is an object store in memory (a fake for this logic test).
type memStore map[string][]byte

func (m memStore) put(b []byte) *job.OutputObject {
	sum := sha256.Sum256(b)
	ref := job.ObjectRef{Tenant: "t", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b))}
	m[ref.Name()] = b
	return job.NewOutputObject(ref, b)
}

func (m memStore) open(_ context.Context, ref job.ObjectRef) (io.ReadCloser, error) {
	b, ok := m[ref.Name()]
	if !ok {
		return nil, errors.New("no such object")
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

type view struct {
	job.Result
	Links string `json:"links"`
}

func encodeView(v *view) func() ([]byte, error) {
	return func() ([]byte, error) {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		err := enc.Encode(v)
		return b.Bytes(), err
	}
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not JSON: %v\n%.300q", err, b)
	}
	return m
}

// Write gives the same document as encoding the Result with its output
// inline, for every kind of output bytes.
func TestWriteMatchesInlineEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		alphabet := []string{"a", "é", "€", "𝄞", "\x00", "\x01", "\x1f", "\b", "\f", "\n", "\t", "\"", "\\", "<", "\u2028", "\xff", "\xc3", "\xe2\x82"}
		var b []byte
		for len(b) < n {
			b = append(b, alphabet[rng.IntN(len(alphabet))]...)
		}
		return b
	}
	outputs := map[string][]byte{
		"empty":    {},
		"ascii":    []byte(strings.Repeat("hello\n", 20000)),
		"controls": bytes.Repeat([]byte{1}, 200000),
		"random":   random(300000),
		"invalid":  append(bytes.Repeat([]byte("€"), 70000), 0xe2, 0x82),
	}
	for name, out := range outputs {
		for _, spillErr := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stderr-spilled=%v", name, spillErr), func(t *testing.T) {
				errb := random(1000)
				inline := view{Links: "/x"}
				inline.Status = job.StatusSucceeded
				inline.SetOutput(out, errb)
				want, _ := encodeView(&inline)()

				st := memStore{}
				v := view{Links: "/x"}
				v.Status = job.StatusSucceeded
				v.SetOutput(nil, errb)
				v.Stdout, v.StdoutBase64 = "", ""
				v.StdoutObject = st.put(out)
				if spillErr {
					v.Stderr, v.StderrBase64 = "", ""
					v.StderrObject = st.put(errb)
				}
				before := v
				var got bytes.Buffer
				if err := Write(context.Background(), &got, &v.Result, encodeView(&v), st.open); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(v, before) {
					t.Fatal("Write changed the result it was given")
				}
				if g, w := decode(t, got.Bytes()), decode(t, want); !reflect.DeepEqual(g, w) {
					t.Fatalf("streamed document differs from the inline one:\n got %.400s\nwant %.400s", got.Bytes(), want)
				}

				loaded := v.Result
				if err := Load(context.Background(), st.open, &loaded); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(loaded, inline.Result) {
					t.Fatal("Load gave a different result from the inline one")
				}
			})
		}
	}
}

func TestWriteReportsAShortObject(t *testing.T) {
	st := memStore{}
	v := view{}
	v.Status = job.StatusSucceeded
	v.StdoutObject = st.put([]byte("hello"))
	v.StdoutObject.Size = 6
	if err := Write(context.Background(), io.Discard, &v.Result, encodeView(&v), st.open); err == nil {
		t.Fatal("a stored object shorter than its reference was written without an error")
	}
	if err := Load(context.Background(), st.open, &v.Result); err == nil {
		t.Fatal("a stored object shorter than its reference was loaded without an error")
	}
}
