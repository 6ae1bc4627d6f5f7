package handlers

import "net/http"

// routes is the whole route table. Pages need a session (else a redirect to /login); /api needs
// a session or a bearer token (else 401); health and static files are public.
func (s *Server) routes(jobsUI http.Handler) http.Handler {
	mux := http.NewServeMux()

	mux.Handle("GET /static/", http.StripPrefix("/static", s.assets.Handler()))

	mux.Handle("GET /login", s.handle(s.loginPage))
	mux.Handle("POST /login", s.handle(s.login))
	mux.Handle("POST /logout", s.handle(s.logout))
	mux.Handle("GET /{$}", s.page(s.dashboard))

	mux.Handle("GET /api/health", s.handle(s.health))
	mux.Handle("GET /api/me", s.api(s.me))

	s.companyRoutes(mux)
	s.projectRoutes(mux)
	s.environmentRoutes(mux)
	s.taskRoutes(mux)
	s.adminRoutes(mux, jobsUI)

	mux.Handle("/api/", s.handle(func(w http.ResponseWriter, r *http.Request) error { return errNotFound }))
	mux.Handle("/", s.handle(func(w http.ResponseWriter, r *http.Request) error { return errNotFound }))
	return mux
}
