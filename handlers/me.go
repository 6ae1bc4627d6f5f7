package handlers

import (
	"net/http"

	"berth/db"
)

// meResponse is GET /api/me.
type meResponse struct {
	ID              string         `json:"id"`
	Email           string         `json:"email"`
	IsInstanceAdmin bool           `json:"is_instance_admin"`
	Memberships     []meMembership `json:"memberships"`
}

type meMembership struct {
	CompanyID string `json:"company_id"`
	Slug      string `json:"slug"`
	Role      string `json:"role"`
}

// me describes the caller: who they are and where they belong.
func (s *Server) me(w http.ResponseWriter, r *http.Request, p *principal) error {
	ms, err := db.UserMemberships(r.Context(), s.pool, p.User.ID)
	if err != nil {
		return err
	}
	out := meResponse{ID: p.User.ID, Email: p.User.Email, IsInstanceAdmin: p.User.IsInstanceAdmin, Memberships: []meMembership{}}
	for _, m := range ms {
		out.Memberships = append(out.Memberships, meMembership{CompanyID: m.CompanyID, Slug: m.CompanySlug, Role: m.Role})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
