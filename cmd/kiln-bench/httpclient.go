package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
)

// leanClient is an HTTP/1.1 client on one keep-alive connection for load
// that shares the cores with the server it measures: it sends a request
// prepared once (request line, headers, body) and parses each answer
// (status line, headers, a Content-Length body) into a buffer it reuses,
// with no goroutine of its own. It refuses what it does not parse
// (chunked bodies, a closing connection, other protocol versions) rather
// than guess.
type leanClient struct {
	conn   net.Conn
	rd     *bufio.Reader
	req    []byte
	answer []byte
}

// dialLean connects to addr (host:port) for requests of method to path
// with body and the given header lines ("Name: value").
func dialLean(ctx context.Context, addr, method, path string, body []byte, header ...string) (*leanClient, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: kiln-bench\r\nContent-Length: %d\r\n", method, path, addr, len(body))
	for _, h := range header {
		req.WriteString(h + "\r\n")
	}
	req.WriteString("\r\n")
	req.Write(body)
	return &leanClient{conn: conn, rd: bufio.NewReaderSize(conn, 16<<10), req: req.Bytes()}, nil
}

func (c *leanClient) Close() error { return c.conn.Close() }

// do sends the request and returns the answer's status and body; the body
// is valid until the next call. The caller sets the connection's deadline.
func (c *leanClient) do() (int, []byte, error) {
	if _, err := c.conn.Write(c.req); err != nil {
		return 0, nil, fmt.Errorf("send: %w", err)
	}
	line, err := c.rd.ReadSlice('\n')
	if err != nil {
		return 0, nil, fmt.Errorf("read status line: %w", err)
	}
	rest, ok := bytes.CutPrefix(line, []byte("HTTP/1.1 "))
	if !ok || len(rest) < 3 {
		return 0, nil, fmt.Errorf("status line %q is not HTTP/1.1", line)
	}
	status, err := strconv.Atoi(string(rest[:3]))
	if err != nil {
		return 0, nil, fmt.Errorf("status line %q: %w", line, err)
	}
	length := -1
	for {
		line, err := c.rd.ReadSlice('\n')
		if err != nil {
			return 0, nil, fmt.Errorf("read header: %w", err)
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, nil, fmt.Errorf("header line %q has no colon", line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil || length < 0 {
				return 0, nil, fmt.Errorf("Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return 0, nil, fmt.Errorf("Transfer-Encoding %q: only Content-Length bodies are read", value)
		case bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(value, []byte("close")):
			return 0, nil, errors.New("the server closes the connection")
		}
	}
	if length < 0 {
		return 0, nil, errors.New("answer without Content-Length")
	}
	if cap(c.answer) < length {
		c.answer = make([]byte, length)
	}
	c.answer = c.answer[:length]
	if _, err := io.ReadFull(c.rd, c.answer); err != nil {
		return 0, nil, fmt.Errorf("read body: %w", err)
	}
	return status, c.answer, nil
}
