package modelserver

// OnSeated sets the hook told, in order, the execution id of each request
// that takes a slot; fn runs under the server's lock and must not block.
func OnSeated(s *Server, fn func(id int64)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onSeated = fn
}
