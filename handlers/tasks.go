package handlers

import "net/http"

// taskRoutes registers the tasks pages, forms and API routes.
func (s *Server) taskRoutes(mux *http.ServeMux) {
}
