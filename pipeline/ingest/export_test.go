package ingest

import (
	"net/http"
	"net/netip"
)

// Routes returns the API routes the server registered ("METHOD /path").
func (s *Server) Routes() []string { return s.routes }

// Queued returns how many accepts wait for a committer.
func (s *Server) Queued() int { return len(s.committer.queue) }

// Waiters returns how many ?wait= registrations the server holds.
func (s *Server) Waiters() int {
	s.wake.mu.Lock()
	defer s.wake.mu.Unlock()
	return len(s.wake.waiters)
}

// Listening reports whether the outcome listener has connected.
func (s *Server) Listening() bool { return s.wake.listened.Load() }

// ClientAddr is clientAddr, for its table test.
func ClientAddr(r *http.Request, trusted []netip.Prefix) string { return clientAddr(r, trusted) }

// Fresh returns how many commands the server knows pending because it
// just accepted them (wakeups.fresh).
func (s *Server) Fresh() int {
	s.wake.mu.Lock()
	defer s.wake.mu.Unlock()
	return len(s.wake.fresh)
}

// KnowsKey reports whether key is among the keys the server knows valid.
func (s *Server) KnowsKey(key string) bool {
	_, ok := s.keys.get(hashKey(key))
	return ok
}

// The outcome read's statements (loadCommand), for BenchmarkOutcomeRead.
const (
	ScopeSQL      = scopeSQL
	GetCommandSQL = getCommandSQL
)
