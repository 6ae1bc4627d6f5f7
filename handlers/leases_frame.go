package handlers

import (
	"net/http"

	"berth/db"
	"berth/views"
)

// leasesFrame is the frame of /leases: the company's navigation when the list is about one
// company (chosen with company_id, or the only one the user can read), so the leases list does not
// drop the user out of their company; the instance-level frame otherwise.
func (s *Server) leasesFrame(r *http.Request, p *principal, companies []db.VisibleCompany, companyID string) views.Frame {
	id := companyID
	if id == "" && len(companies) == 1 {
		id = companies[0].ID
	}
	for _, c := range companies {
		if c.ID != id {
			continue
		}
		if a, err := s.companyAccess(r.Context(), p, c.ID); err == nil {
			return s.companyFrame(r, a, "Leases · "+a.Company.Name, "leases")
		}
	}
	return s.frame(r, "Leases", "leases")
}
