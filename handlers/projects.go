package handlers

import "net/http"

// projectRoutes registers the projects pages, forms and API routes.
func (s *Server) projectRoutes(mux *http.ServeMux) {
}
