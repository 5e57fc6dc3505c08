package otlptest

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one received span.
type Span struct {
	*tracepb.Span
	Attrs    map[string]string // the span's attributes, values as text
	Resource map[string]string // its resource's attributes, values as text
}

// Receiver records every export request it was sent.
type Receiver struct {
	mu    sync.Mutex
	reqs  []*collectortrace.ExportTraceServiceRequest
	paths []string // the HTTP path, or the gRPC method, of each request
}

func (r *Receiver) add(path string, req *collectortrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	r.paths = append(r.paths, path)
}

// Paths are the HTTP paths (or gRPC methods) requests came to, in order.
func (r *Receiver) Paths() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.paths...)
}

// Spans are all spans received so far, in arrival order.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Span
	for _, req := range r.reqs {
		for _, rs := range req.GetResourceSpans() {
			res := AttrMap(rs.GetResource().GetAttributes())
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					out = append(out, Span{Span: s, Attrs: AttrMap(s.GetAttributes()), Resource: res})
				}
			}
		}
	}
	return out
}

// AttrMap renders OTLP attributes as text: ints and bools in Go syntax,
// everything else as its string value.
func AttrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = fmt.Sprint(v.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = fmt.Sprint(v.BoolValue)
		default:
			m[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
	}
	return m
}

// NewHTTP starts an OTLP/HTTP endpoint and returns its receiver and base URL
// (set OTEL_EXPORTER_OTLP_ENDPOINT to it). Any path is accepted and recorded.
func NewHTTP(t testing.TB) (*Receiver, string) {
	t.Helper()
	rec := &Receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want POST application/x-protobuf", http.StatusUnsupportedMediaType)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		raw, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req := &collectortrace.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(raw, req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rec.add(r.URL.Path, req)
		resp, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(resp)
	}))
	t.Cleanup(srv.Close)
	return rec, srv.URL
}

type grpcTraceService struct {
	collectortrace.UnimplementedTraceServiceServer
	rec *Receiver
}

func (s *grpcTraceService) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	s.rec.add(collectortrace.TraceService_Export_FullMethodName, req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// NewGRPC starts an OTLP/gRPC endpoint and returns its receiver and host:port.
func NewGRPC(t testing.TB) (*Receiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("otlptest: listen: %v", err)
	}
	rec := &Receiver{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, &grpcTraceService{rec: rec})
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	return rec, lis.Addr().String()
}

// NewHung starts an endpoint that accepts connections and never answers, the
// worst case for an exporter: only its timeout ends each request. It returns
// the address and a count of the connections accepted, which proves the
// exporter did try.
func NewHung(t testing.TB) (addr string, accepted func() int) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("otlptest: listen: %v", err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return lis.Addr().String(), func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
}
