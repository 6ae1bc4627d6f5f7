package handlers

import "net/http"

// companyRoutes registers the companies pages, forms and API routes.
func (s *Server) companyRoutes(mux *http.ServeMux) {
}
