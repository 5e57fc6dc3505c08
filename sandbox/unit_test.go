package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/initproto"
)

func TestDecodeMetricsV1(t *testing.T) {
	t.Parallel()
	a, err := anypb.New(&v1.Metrics{
		CPU: &v1.CPUStat{Usage: &v1.CPUUsage{Total: 1_500_000_000}},
		Memory: &v1.MemoryStat{
			Usage: &v1.MemoryEntry{Max: 40 << 20, Failcnt: 3},
			Swap:  &v1.MemoryEntry{Max: 42 << 20},
		},
		MemoryOomControl: &v1.MemoryOomControl{OomKill: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	u, err := decodeMetrics(a)
	if err != nil {
		t.Fatal(err)
	}
	want := usage{CPU: 1500 * time.Millisecond, MemoryPeak: 42 << 20, MemoryFailcnt: 3, OOMKills: 1}
	if u != want {
		t.Fatalf("got %+v; want %+v", u, want)
	}
}

func TestDecodeMetricsV2(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		m    *v2.Metrics
		want usage
	}{
		{"with memory.peak", &v2.Metrics{
			CPU:    &v2.CPUStat{UsageUsec: 250_000},
			Memory: &v2.MemoryStat{Usage: 1 << 20, MaxUsage: 30 << 20, UsageLimit: 64 << 20},
		}, usage{CPU: 250 * time.Millisecond, MemoryPeak: 30 << 20}},
		{"without memory.peak: current usage is the floor", &v2.Metrics{
			CPU:    &v2.CPUStat{UsageUsec: 1000},
			Memory: &v2.MemoryStat{Usage: 5 << 20, UsageLimit: 64 << 20},
		}, usage{CPU: time.Millisecond, MemoryPeak: 5 << 20, PeakEstimated: true}},
		{"oom kill without memory.peak: the limit was reached", &v2.Metrics{
			Memory:       &v2.MemoryStat{Usage: 1 << 20, UsageLimit: 64 << 20},
			MemoryEvents: &v2.MemoryEvents{Max: 10, Oom: 1, OomKill: 1},
		}, usage{MemoryPeak: 64 << 20, OOMKills: 1, PeakEstimated: true}},
		{"unlimited stays unlimited", &v2.Metrics{
			Memory:       &v2.MemoryStat{Usage: 1 << 20, UsageLimit: 1<<63 - 1},
			MemoryEvents: &v2.MemoryEvents{OomKill: 1},
		}, usage{MemoryPeak: 1 << 20, OOMKills: 1, PeakEstimated: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := anypb.New(tt.m)
			if err != nil {
				t.Fatal(err)
			}
			u, err := decodeMetrics(a)
			if err != nil {
				t.Fatal(err)
			}
			if u != tt.want {
				t.Fatalf("got %+v; want %+v", u, tt.want)
			}
		})
	}
}

func TestDecodeMetricsUnknown(t *testing.T) {
	t.Parallel()
	if _, err := decodeMetrics(&anypb.Any{TypeUrl: "example.com/Other"}); err == nil {
		t.Fatal("want an error for an unknown metrics type")
	}
	if _, err := decodeMetrics(nil); err == nil {
		t.Fatal("want an error for no metrics")
	}
}

func TestCappedBuffer(t *testing.T) {
	t.Parallel()
	c := newCappedBuffer(10)
	for range 1000 {
		if n, err := c.Write([]byte("0123456789abcdef\n")); n != 17 || err != nil {
			t.Fatalf("Write = %d, %v; want all bytes accepted", n, err)
		}
	}
	kept, total, trunc := c.Bytes()
	if string(kept) != "0123456789" || total != 17000 || !trunc {
		t.Fatalf("kept %q total %d truncated %v", kept, total, trunc)
	}
	if tail := c.Tail(); len(tail) != tailBytes || !bytes.HasSuffix(tail, []byte("abcdef\n")) {
		t.Fatalf("tail is %d bytes ending %q", len(tail), tail[max(0, len(tail)-10):])
	}
	big := bytes.Repeat([]byte("y"), 3*tailBytes)
	big = append(big, "END"...)
	c.Write(big)
	if tail := c.Tail(); len(tail) != tailBytes || !bytes.HasSuffix(tail, []byte("yEND")) {
		t.Fatalf("tail after a big write: %d bytes", len(tail))
	}
	small := newCappedBuffer(100)
	small.Write([]byte("hi"))
	if kept, total, trunc := small.Bytes(); string(kept) != "hi" || total != 2 || trunc {
		t.Fatalf("small: %q %d %v", kept, total, trunc)
	}
}

func TestEncodeFrame(t *testing.T) {
	t.Parallel()
	spec := job.Spec{Code: "print(1)", Files: []job.File{{Name: "a/b.bin", Content: "AAEC", Encoding: "base64"}, {Name: "t.txt", Content: "hé"}}}
	frame, err := encodeFrame(spec)
	if err != nil {
		t.Fatal(err)
	}
	head, body, ok := bytes.Cut(frame, []byte("\n"))
	if !ok || !bytes.HasPrefix(head, []byte(initproto.FrameMagic+" ")) {
		t.Fatalf("frame header %q", head)
	}
	var n int
	if _, err := fmt.Sscan(string(head[len(initproto.FrameMagic+" "):]), &n); err != nil || n != len(body) {
		t.Fatalf("header length %q vs body %d", head, len(body))
	}
	var got struct {
		Code  string            `json:"code"`
		Args  []string          `json:"args"`
		Env   map[string]string `json:"env"`
		Files []struct {
			Name string `json:"name"`
			Data []byte `json:"data"`
		} `json:"files"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if got.Code != "print(1)" || got.Args == nil || got.Env == nil || len(got.Files) != 2 ||
		!bytes.Equal(got.Files[0].Data, []byte{0, 1, 2}) || string(got.Files[1].Data) != "hé" {
		t.Fatalf("decoded frame %+v", got)
	}
	if _, err := encodeFrame(job.Spec{Code: "x", Files: []job.File{{Name: "f", Content: "!!", Encoding: "base64"}}}); err == nil {
		t.Fatal("bad base64 must be an error")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	bad := Config{CPUs: -1, WorkerID: "a b", Images: map[string]string{"python": ""}}
	err := bad.Validate()
	if err == nil {
		t.Fatal("want errors")
	}
	for _, want := range []string{"CPUs", "WorkerID", "Images"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	c := Config{}.withDefaults()
	if c.Namespace != "kiln" || c.Images["python"] != "kiln.local/python:latest" || c.CPUs != 1 || c.Policy != job.DefaultPolicy() {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestCreateErrorChain(t *testing.T) {
	cause := errors.New("runc create failed")
	err := fmt.Errorf("run job: %w", createError{cause})
	if !errors.Is(err, ErrCreate) || !errors.Is(err, cause) {
		t.Fatalf("%v: want both ErrCreate and the cause in the chain", err)
	}
	var cf interface{ SandboxCreateFailed() bool }
	if !errors.As(err, &cf) || !cf.SandboxCreateFailed() {
		t.Fatalf("%v: no SandboxCreateFailed method in the chain", err)
	}
	if !strings.Contains(err.Error(), "runc create failed") {
		t.Fatalf("message %q lost the cause", err)
	}
}
