package events

import (
	"bytes"
	"testing"
	"unicode/utf8"
)

// cut never splits a UTF-8 character unless the chunk is final, and never
// returns more than MaxChunk bytes.
func TestCutKeepsCharactersWhole(t *testing.T) {
	text := bytes.Repeat([]byte("é"), MaxChunk) // 2 bytes each
	c := cut(text, false)
	if len(c) > MaxChunk || !utf8.Valid(c) || len(c) == 0 {
		t.Fatalf("cut of %d bytes of text: %d bytes, valid %v", len(text), len(c), utf8.Valid(c))
	}
	partial := []byte("ab\xe2\x82") // "ab" + the first two bytes of "€"
	if c := cut(partial, false); string(c) != "ab" {
		t.Errorf("non-final cut %q; want the incomplete character held back", c)
	}
	if c := cut(partial, true); !bytes.Equal(c, partial) {
		t.Errorf("final cut %q; want everything", c)
	}
	bin := bytes.Repeat([]byte{0xff}, MaxChunk+10)
	if c := cut(bin, false); len(c) != MaxChunk {
		t.Errorf("cut of binary: %d bytes; want %d", len(c), MaxChunk)
	}
}
