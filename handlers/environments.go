package handlers

import "net/http"

// environmentRoutes registers the environments pages, forms and API routes.
func (s *Server) environmentRoutes(mux *http.ServeMux) {
}
