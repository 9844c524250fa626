package pipelinetest

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for a writer and a reader at once: the
// destination of a component's logs, or of onceflow dev's output, that the
// test reads while it runs.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
