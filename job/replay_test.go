package job

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"testing"
)

func TestCompareReplay(t *testing.T) {
	orig := &Result{Status: StatusSucceeded, ExitCode: IntPtr(0), Image: Image{Digest: "sha256:a"},
		Artifacts: []Artifact{{Name: "a", SHA256: "1"}, {Name: "b", SHA256: "2"}}}
	orig.SetOutput([]byte("same\n"), []byte("warn\n"))
	same := *orig
	same.Artifacts = []Artifact{{Name: "b", SHA256: "2"}, {Name: "a", SHA256: "1"}} // order does not matter
	if c := CompareReplay(orig, &same); !c.Identical || c.Differs != nil {
		t.Fatalf("same outcome: %+v", c)
	}
	// Output kept in the object store compares by its SHA-256.
	sum := sha256.Sum256([]byte("same\n"))
	spilled := same
	spilled.Stdout, spilled.StdoutObject = "", &OutputObject{ObjectRef: ObjectRef{SHA256: hex.EncodeToString(sum[:])}}
	if c := CompareReplay(orig, &spilled); !c.Identical {
		t.Fatalf("spilled identical output: %+v", c)
	}
	diff := same
	diff.SetOutput([]byte("other\n"), []byte("warn\n"))
	diff.ExitCode = IntPtr(1)
	diff.Artifacts = []Artifact{{Name: "a", SHA256: "9"}}
	diff.Image.Digest = "sha256:b"
	if c := CompareReplay(orig, &diff); c.Identical || !slices.Equal(c.Differs, []string{"stdout", "exit_code", "artifacts", "image_digest"}) {
		t.Fatalf("different outcome: %+v", c)
	}
}
