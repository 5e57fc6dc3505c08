package sandbox

import (
	"bytes"
	"sync"
)

// tailBytes is how much of the end of a stream is kept apart from the capped
// head, so the outcome can read the last line of stderr (the exception) even
// when the head was truncated.
const tailBytes = 4 << 10

// cappedBuffer keeps the first max bytes written to it and the last tailBytes,
// and counts everything. It never refuses a write: a program that prints more
// than the cap keeps running and its output is drained, never buffered without
// bound.
type cappedBuffer struct {
	mu    sync.Mutex
	max   int64
	head  []byte
	tail  []byte
	total int64
}

func newCappedBuffer(max int64) *cappedBuffer {
	return &cappedBuffer{max: max, head: make([]byte, 0, min(max, 64<<10))}
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(p))
	if room := c.max - int64(len(c.head)); room > 0 {
		c.head = append(c.head, p[:min(room, int64(len(p)))]...)
	}
	if len(p) >= tailBytes {
		c.tail = append(c.tail[:0], p[len(p)-tailBytes:]...)
	} else {
		c.tail = append(c.tail, p...)
		if over := len(c.tail) - tailBytes; over > 0 {
			c.tail = append(c.tail[:0], c.tail[over:]...)
		}
	}
	return len(p), nil
}

// reset drops everything written so far and sets a new cap: a pooled
// sandbox's buffers are made before its job's limits are known.
func (c *cappedBuffer) reset(max int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.max, c.head, c.tail, c.total = max, c.head[:0], c.tail[:0], 0
}

// Bytes returns the kept head, the total written and whether the head is short of it.
func (c *cappedBuffer) Bytes() (kept []byte, total int64, truncated bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.head, c.total, c.total > int64(len(c.head))
}

// contains reports whether what was kept so far holds b.
func (c *cappedBuffer) contains(b []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Contains(c.head, b)
}

// Tail returns up to the last tailBytes written.
func (c *cappedBuffer) Tail() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.tail...)
}
