package initproto

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// A frame is its header line and exactly the JSON it announces, with empty
// (never null) args, env and files.
func TestFrameEncode(t *testing.T) {
	b, err := Frame{Code: "print(1)"}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	head, body, ok := bytes.Cut(b, []byte("\n"))
	n, err := strconv.Atoi(strings.TrimPrefix(string(head), FrameMagic+" "))
	if !ok || err != nil || n != len(body) {
		t.Fatalf("header %q announces %d bytes; body has %d", head, n, len(body))
	}
	var got map[string]any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"args", "env", "files"} {
		if got[k] == nil {
			t.Errorf("%s is null in %s", k, body)
		}
	}
	if _, ok := got["cpu_s"]; ok {
		t.Errorf("cpu_s sent without a CPU limit: %s", body)
	}
}

// The box header is always BoxHeaderSize bytes, newline last, as box.py
// reads it.
func TestBoxHeader(t *testing.T) {
	for _, n := range []int{0, 7, 123456} {
		h := BoxHeader(n)
		if len(h) != BoxHeaderSize || h[len(h)-1] != '\n' || !bytes.HasPrefix(h, []byte(FrameMagic+" "+strconv.Itoa(n)+" ")) {
			t.Errorf("BoxHeader(%d) = %q", n, h)
		}
	}
}
