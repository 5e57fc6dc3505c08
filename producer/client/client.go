package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to one Kiln API server. It is safe for concurrent use.
type Client struct {
	base   string // scheme://host[:port][/prefix], no trailing slash
	apiKey string
	hc     *http.Client
	retry  RetryPolicy
}

// Option configures a Client.
type Option func(*Client)

// WithAPIKey sends key as "Authorization: Bearer <key>".
func WithAPIKey(key string) Option { return func(c *Client) { c.apiKey = key } }

// WithHTTPClient uses hc instead of a default http.Client. Give it no
// Timeout shorter than the longest wait you ask for (60s by default on the
// server); deadlines are better set on the ctx of each call.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// New returns a client of the API at baseURL, e.g. "http://127.0.0.1:8080".
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("kiln client: base URL %q: %w", baseURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("kiln client: base URL %q must be http:// or https:// with a host", baseURL)
	}
	c := &Client{base: strings.TrimRight(baseURL, "/"), hc: &http.Client{}, retry: RetryPolicy{}.withDefaults()}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{}
	}
	return c, nil
}

// rawBody is a request body sent as it is (application/octet-stream), not
// as JSON.
type rawBody []byte

// do sends a request (in as JSON, or a rawBody) and decodes a 2xx JSON
// answer into out. Non-2xx answers become *Error. It returns the HTTP
// status.
func (c *Client) do(ctx context.Context, method, path string, in any, hdr http.Header, out any) (int, error) {
	var body io.Reader
	ctype := "application/json"
	switch b := in.(type) {
	case nil:
	case rawBody:
		body, ctype = bytes.NewReader(b), "application/octet-stream"
	default:
		raw, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("kiln client: encode request: %w", err)
		}
		body = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return 0, fmt.Errorf("kiln client: %s %s: %w", method, path, err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if in != nil {
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("kiln client: %s %s: %w", method, path, &networkError{err})
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("kiln client: %s %s: read answer: %w", method, path, &networkError{err})
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, errorFromResponse(resp, raw)
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("kiln client: %s %s: decode answer: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// waitParam renders d for ?wait=.
func waitParam(d time.Duration) string {
	return url.QueryEscape(d.Round(time.Millisecond).String())
}

// jobPath is the path of job id; the id is escaped so a bad one gets a 400
// from the server rather than reaching another endpoint.
func jobPath(id string) string { return "/v1/jobs/" + url.PathEscape(id) }
