package mcpserver

import (
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
)

// maxResourceBytes bounds an artifact read as a resource.
const maxResourceBytes = 32 << 20

// notFoundError is a 404 of the artifact route.
type notFoundError struct{ path string }

func (e *notFoundError) Error() string { return "no artifact at " + e.path }

// fetch GETs an artifact route of the API, at most max bytes, and returns
// its content and media type.
func (s *Server) fetch(ctx context.Context, path string, max int64) ([]byte, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(s.cfg.BaseURL, "/")+path, nil)
	if err != nil {
		return nil, "", fmt.Errorf("artifact %s: %w", path, err)
	}
	if s.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.APIKey)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("artifact %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, "", &notFoundError{path}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("artifact %s: the API answered %s", path, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, "", fmt.Errorf("artifact %s: %w", path, err)
	}
	if int64(len(data)) > max {
		return nil, "", fmt.Errorf("artifact %s is larger than %d bytes", path, max)
	}
	ctype, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return data, ctype, nil
}
