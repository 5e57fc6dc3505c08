package sandbox

import "testing"

func TestImagesFor(t *testing.T) {
	t.Parallel()
	got, err := ImagesFor([]string{"python", " node ", "custom=registry.local/x:1"})
	if err != nil {
		t.Fatal(err)
	}
	if got["python"] != "kiln.local/python:latest" || got["node"] != "kiln.local/node:latest" || got["custom"] != "registry.local/x:1" {
		t.Fatalf("ImagesFor = %v", got)
	}
	for _, bad := range [][]string{{"py.thon"}, {"python", "python"}, {""}, {"Py"}} {
		if _, err := ImagesFor(bad); err == nil {
			t.Errorf("ImagesFor(%q) accepted", bad)
		}
	}
}
